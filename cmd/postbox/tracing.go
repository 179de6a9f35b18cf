package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/postbox-events/postbox/internal/tracing"
)

// traceFlushTimeout bounds how long a command waits at exit for its last
// spans to be exported.
const traceFlushTimeout = 5 * time.Second

// startTracing exports the command's spans over OTLP when the standard
// OTEL_* variables ask for it (internal/tracing.Setup); service names the
// command ("postbox-serve"). stop flushes what is left; call it at exit.
func startTracing(ctx context.Context, env *cmdEnv, service string, log *slog.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, service, env.getenv)
	if err != nil {
		return nil, err
	}
	if tracing.Configured(env.getenv) {
		log.Info("tracing: exporting spans over OTLP", "service", service)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceFlushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("tracing: spans not exported at exit", "err", err)
		}
	}, nil
}
