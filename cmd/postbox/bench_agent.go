package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/postbox-events/postbox/internal/bench"
	"github.com/postbox-events/postbox/internal/groupcommit"
)

func runBenchAgent(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench agent", "[flags]", `Measures the agent path end to end against direct ingest, in one run. The agent path: events
posted to an agent's local intake as postbox send posts them (JSON arrays of --chunk envelopes,
--senders requests in flight), committed in its SQLite outbox, relayed over a WebSocket to a server
that stores them in its own SQLite file; timed until the server stored every event and the agent's
outbox is empty. Direct ingest: as many events sent by --devices devices straight to a server, as
postbox bench sends them. The server, the agent and the loader run in this process, each server and
the outbox on a fresh file of a temporary directory. Each of --rounds rounds runs both, in
alternating order; the ratio is of the medians. Every event must be stored exactly once and the
outbox left empty, or the command fails. Progress goes to stderr; --json prints one JSON object as
the last line of stdout.`)
	events := positiveInt(200000)
	fs.Var(&events, "events", "`events` per run of each path")
	rounds := positiveInt(1)
	fs.Var(&rounds, "rounds", "`rounds` of both paths, alternating which goes first")
	payloadBytes := payloadSize(300)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each payload in `bytes`")
	chunk := positiveInt(sendChunk)
	fs.Var(&chunk, "chunk", "`events` per POST to the intake (as postbox send)")
	senders := positiveInt(defaultSendParallel)
	fs.Var(&senders, "senders", "POSTs to the intake in flight at once (postbox send --parallel)")
	batch := positiveInt(agentBatch)
	fs.Var(&batch, "batch", "the agent's most `events` per frame (postbox agent --batch)")
	window := positiveInt(agentWindow)
	fs.Var(&window, "window", "the agent's most `events` in flight (postbox agent --window)")
	devices := positiveInt(50)
	fs.Var(&devices, "devices", "direct ingest's `devices` (connections)")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "the servers' most `events` per group commit")
	queueSize := positiveInt(groupcommit.DefaultQueueSize)
	fs.Var(&queueSize, "queue-size", "the servers' writer queue bound in `events`")
	sync := fs.String("synchronous", "FULL", "SQLite synchronous mode of the servers and the outbox")
	agentOnly := fs.Bool("agent-only", false, "run the agent path alone, without direct ingest")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the first agent-path run (agent, server and loader) to this file")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	res, err := bench.Agent(ctx, bench.AgentConfig{
		Events: int(events), Rounds: int(rounds), PayloadBytes: int(payloadBytes),
		Chunk: int(chunk), Senders: int(senders), Batch: int(batch), Window: int(window), Devices: int(devices),
		MaxBatch: int(maxBatch), QueueSize: int(queueSize), Synchronous: *sync, SkipDirect: *agentOnly,
		CPUProfile: *cpuprofile, Open: openBench, Progress: env.stderr,
	})
	if err != nil {
		return benchErr(err)
	}
	fmt.Fprintf(env.stderr, "bench agent: %d events: agent path %.0f events/s end to end (intake %.0f events/s)", res.Events, res.AgentEventsPerS, res.IntakeEventsPerS)
	if res.DirectEventsPerS > 0 {
		fmt.Fprintf(env.stderr, ", direct %.0f events/s: ratio %.2f", res.DirectEventsPerS, res.Ratio)
	}
	fmt.Fprintf(env.stderr, " (medians of %d rounds)\n", rounds)
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(env.stdout, string(b))
	}
	return res.Check()
}
