package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"text/tabwriter"
)

// streamInfo is a stream as GET /v1/streams answers it.
type streamInfo struct {
	Stream        string  `json:"stream"`
	Source        string  `json:"source"`
	Backend       string  `json:"backend"`
	Events        int64   `json:"events"`
	FirstOffset   int64   `json:"first_offset"`
	LastOffset    int64   `json:"last_offset"`
	FirstStoredAt apiTime `json:"first_stored_at"`
	LastStoredAt  apiTime `json:"last_stored_at"`
	CreatedAt     apiTime `json:"created_at"`
}

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
	var streams []streamInfo
	var raw json.RawMessage
	switch fs.NArg() {
	case 0:
		var out struct {
			Streams []json.RawMessage `json:"streams"`
		}
		if _, err := c.get(ctx, "/v1/streams", &out); err != nil {
			return fmt.Errorf("streams: %w", err)
		}
		raw = jsonArray(out.Streams)
		if err := json.Unmarshal(raw, &streams); err != nil {
			return fmt.Errorf("streams: the server's answer: %w", err)
		}
	case 1:
		var s streamInfo
		raw, err = c.get(ctx, "/v1/streams/"+url.PathEscape(fs.Arg(0)), &s)
		if err != nil {
			return fmt.Errorf("streams %s: %w", fs.Arg(0), err)
		}
		streams = []streamInfo{s}
	default:
		return usagef("streams: takes at most one STREAM, got %d arguments", fs.NArg())
	}
	if af.json {
		return printJSON(env, raw)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tBACKEND\tEVENTS\tFIRST\tLAST\tFIRST_STORED\tLAST_STORED")
	for _, s := range streams {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Stream, s.Backend, s.Events, s.FirstOffset, s.LastOffset, s.FirstStoredAt, s.LastStoredAt)
	}
	return tw.Flush()
}

// consumerInfo is a consumer as GET /v1/consumers answers it.
type consumerInfo struct {
	Consumer      string  `json:"consumer"`
	Subscription  string  `json:"subscription"`
	Stream        string  `json:"stream"`
	NextOffset    int64   `json:"next_offset"`
	HighWatermark int64   `json:"high_watermark"`
	Lag           int64   `json:"lag"`
	UpdatedAt     apiTime `json:"updated_at"`
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
	consumers, printed, err := getList[consumerInfo](ctx, env, c, af, "/v1/consumers", "consumers")
	if err != nil || printed {
		return wrapErr("consumers", err)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTREAM\tNEXT_OFFSET\tHIGH_WATERMARK\tLAG")
	for _, c := range consumers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", orDash(c.Subscription), c.Stream, c.NextOffset, c.HighWatermark, c.Lag)
	}
	return tw.Flush()
}
