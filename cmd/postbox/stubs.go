package main

import "context"

func runAgent(ctx context.Context, env *cmdEnv, args []string) error  { return usagef("agent: not built yet") }
func runSend(ctx context.Context, env *cmdEnv, args []string) error   { return usagef("send: not built yet") }
func runOutbox(ctx context.Context, env *cmdEnv, args []string) error { return usagef("outbox: not built yet") }
