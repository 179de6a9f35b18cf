package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

func runServe(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "serve", "[flags]", `Runs the control plane: the WebSocket ingress (`+ingress.WSPath+`), the webhook intake
(POST /webhooks), the SQLite store with its single group-commit writer, subscriptions and
their inboxes (the API of docs/API.md), /health, /ready and /metrics. Every event is ACKed only
after its transaction committed. Flags win over the environment variables named in brackets.`)
	addr := fs.String("addr", ":8000", "listen address [POSTBOX_ADDR]")
	db := fs.String("db", "data/postbox.db", "SQLite database file [DB_PATH]")
	sync := fs.String("synchronous", "FULL", "SQLite synchronous mode: FULL (an ACK survives power loss) or NORMAL [POSTBOX_SYNCHRONOUS]")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "most `events` written per group commit; 1 = one transaction per event [POSTBOX_MAX_BATCH]")
	queue := positiveInt(groupcommit.DefaultQueueSize)
	fs.Var(&queue, "queue-size", "bound of the writer queue in `events`; when full, ingress stops reading [QUEUE_MAXSIZE]")
	queueBytes := positiveInt(streamsqlite.DefaultQueueBytes)
	fs.Var(&queueBytes, "queue-bytes", "bound of the writer queue in payload `bytes` [POSTBOX_QUEUE_BYTES]")
	maxEnv := positiveInt(postbox.DefaultMaxEnvelopeBytes)
	fs.Var(&maxEnv, "max-envelope-bytes", "largest envelope accepted, in `bytes` [POSTBOX_MAX_ENVELOPE_BYTES]")
	whMax := positiveInt(server.DefaultWebhookMaxBytes)
	fs.Var(&whMax, "webhook-max-bytes", "largest webhook body accepted on POST /webhooks, in `bytes` [POSTBOX_WEBHOOK_MAX_BYTES]")
	whKeyHeader := fs.String("webhook-key-header", "", "another `header` holding a webhook's idempotency key, e.g. X-GitHub-Delivery [POSTBOX_WEBHOOK_KEY_HEADER]")
	whKeyField := fs.String("webhook-key-field", "", "a top-level JSON `field` holding it, e.g. id for Stripe [POSTBOX_WEBHOOK_KEY_FIELD]")
	whTypeHeader := fs.String("webhook-type-header", "", "another `header` holding a webhook's type, e.g. X-GitHub-Event [POSTBOX_WEBHOOK_TYPE_HEADER]")
	whTypeField := fs.String("webhook-type-field", "", "a top-level JSON `field` holding it, e.g. type for Stripe [POSTBOX_WEBHOOK_TYPE_FIELD]")
	whSecrets := fs.String("webhook-secret", "", "Standard Webhooks `secrets` (whsec_…, comma-separated while rotating): POST /webhooks then requires a valid signature [POSTBOX_WEBHOOK_SECRET]")
	tokens := fs.String("auth-tokens", "", "file of 'TOKEN DEVICE_ID' lines; requires a bearer token on the ingress [POSTBOX_AUTH_TOKENS]")
	apiToken := fs.String("api-token", "", "bearer `token` the operator API (subscriptions, streams, consumers, inboxes) requires [POSTBOX_API_TOKEN]")
	cert := fs.String("tls-cert", "", "TLS certificate file (PEM); serves HTTPS/WSS with --tls-key [POSTBOX_TLS_CERT]")
	key := fs.String("tls-key", "", "TLS private key file (PEM) [POSTBOX_TLS_KEY]")
	level := fs.String("log-level", "info", "debug, info, warn or error [LOG_LEVEL]")
	format := fs.String("log-format", "pretty", "json or pretty [LOG_FORMAT]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("serve takes no arguments, got %q", fs.Args())
	}
	if err := envDefaults(env, fs, map[string]string{
		"addr": "POSTBOX_ADDR", "db": "DB_PATH", "synchronous": "POSTBOX_SYNCHRONOUS", "max-batch": "POSTBOX_MAX_BATCH",
		"queue-size": "QUEUE_MAXSIZE", "queue-bytes": "POSTBOX_QUEUE_BYTES", "max-envelope-bytes": "POSTBOX_MAX_ENVELOPE_BYTES", "auth-tokens": "POSTBOX_AUTH_TOKENS", "api-token": "POSTBOX_API_TOKEN",
		"webhook-max-bytes": "POSTBOX_WEBHOOK_MAX_BYTES", "webhook-key-header": "POSTBOX_WEBHOOK_KEY_HEADER", "webhook-key-field": "POSTBOX_WEBHOOK_KEY_FIELD",
		"webhook-type-header": "POSTBOX_WEBHOOK_TYPE_HEADER", "webhook-type-field": "POSTBOX_WEBHOOK_TYPE_FIELD",
		"webhook-secret": "POSTBOX_WEBHOOK_SECRET",
		"tls-cert":       "POSTBOX_TLS_CERT", "tls-key": "POSTBOX_TLS_KEY", "log-level": "LOG_LEVEL", "log-format": "LOG_FORMAT",
	}); err != nil {
		return err
	}
	log, err := newLogger(env.stderr, *level, *format)
	if err != nil {
		return err
	}
	cfg := server.Config{
		Addr:        *addr,
		DBPath:      *db,
		Synchronous: strings.ToUpper(*sync),
		MaxBatch:    int(maxBatch),
		QueueSize:   int(queue),
		QueueBytes:  int(queueBytes),
		Limits:      postbox.Limits{MaxEnvelopeBytes: int(maxEnv)},
		TLSCert:     *cert,
		TLSKey:      *key,
		APIToken:    *apiToken,
		Webhooks: server.WebhookConfig{MaxBytes: int64(whMax), KeyHeader: *whKeyHeader, KeyField: *whKeyField,
			TypeHeader: *whTypeHeader, TypeField: *whTypeField, Secrets: splitList(*whSecrets)},
		Logger: log,
	}
	if *tokens != "" {
		if cfg.Tokens, err = readTokens(*tokens); err != nil {
			return err
		}
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// readTokens reads a tokens file: one "TOKEN DEVICE_ID" per line; blank
// lines and lines starting with # are skipped.
func readTokens(path string) (ingress.Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth tokens: %w", err)
	}
	defer f.Close()
	tokens := ingress.Tokens{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("auth tokens %s:%d: want 'TOKEN DEVICE_ID', got %d fields", path, n, len(fields))
		}
		tokens.Add(fields[0], fields[1])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth tokens %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("auth tokens %s: no tokens in the file", path)
	}
	return tokens, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
