package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/retry"
)

// A runtime handles the items of the inbox planner until ctx ends: at
// most 16 at once, each lease extended while its job runs.
func ExampleAPI_Inbox() {
	c, err := client.NewAPI("http://127.0.0.1:8000", client.APIOptions{Token: "s3cret"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background() // cancel it to stop: running jobs finish first
	err = c.Inbox("planner", client.RunnerConfig{Concurrency: 16, VisibilityTimeout: time.Minute}).Run(ctx,
		func(ctx context.Context, it api.Item) error {
			if len(it.Payload) == 0 {
				return retry.Permanent(errors.New("empty payload")) // a dead letter at once
			}
			fmt.Println("planning", it.EventID)
			return nil // acked
		})
	if err != nil {
		log.Fatal(err) // a wrong token, say
	}
}

// An operator replays the dead letters of one subscription.
func ExampleAPI_ReplayDeadLetters() {
	c, err := client.NewAPI("http://127.0.0.1:8000", client.APIOptions{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.ReplayDeadLetters(context.Background(), api.ReplayDeadLetters{Subscription: "billing"})
	switch {
	case client.IsNotFound(err):
		fmt.Println("no such subscription")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("replayed", res.Replayed)
	}
}
