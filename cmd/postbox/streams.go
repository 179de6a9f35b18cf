package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/postbox-events/postbox/api"
)

func runStreams(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "streams", "[STREAM] [flags]", `Shows the server's streams: one per source (devices, webhooks, …), with how many
events each holds, its first and last offset (the last is the high watermark) and
when its first and last stored events were stored. An empty stream shows offsets 0.
With STREAM, shows that stream only.`)
	af := addAPIFlags(fs, "print the streams as a JSON array (with STREAM: that stream's JSON object)")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	var streams []api.Stream
	switch fs.NArg() {
	case 0:
		if streams, err = c.Streams(ctx); err != nil {
			return fmt.Errorf("streams: %w", c.explain(err))
		}
		if af.json {
			return printJSON(env, jsonArray(streams))
		}
	case 1:
		s, err := c.Stream(ctx, fs.Arg(0))
		if err != nil {
			return fmt.Errorf("streams %s: %w", fs.Arg(0), c.explain(err))
		}
		if af.json {
			return printValue(env, s)
		}
		streams = []api.Stream{s}
	default:
		return usagef("streams: takes at most one STREAM, got %d arguments", fs.NArg())
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tBACKEND\tEVENTS\tFIRST\tLAST\tFIRST_STORED\tLAST_STORED")
	for _, s := range streams {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Stream, s.Backend, s.Events, s.FirstOffset, s.LastOffset, whenPtr(s.FirstStoredAt), whenPtr(s.LastStoredAt))
	}
	return tw.Flush()
}

func runConsumers(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "consumers", "[flags]", `Shows the consumers: one per subscription, with the next offset it will look at in
its stream, the stream's high watermark, and its lag (how many events at or after
its next offset it has not yet looked at).`)
	af := addAPIFlags(fs, "print the consumers as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	consumers, err := c.Consumers(ctx)
	if err != nil {
		return fmt.Errorf("consumers: %w", c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(consumers))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTREAM\tNEXT_OFFSET\tHIGH_WATERMARK\tLAG")
	for _, c := range consumers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", orDash(c.Subscription), c.Stream, c.NextOffset, c.HighWatermark, c.Lag)
	}
	return tw.Flush()
}
