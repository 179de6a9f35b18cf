// Command kfakeserver runs franz-go's in-process Kafka broker, kfake, as a
// program on loopback ports, so that postbox (or its bench) can be tried
// and measured on Kafka where no Kafka is installed:
//
//	go run ./internal/kafkatest/kfakeserver -brokers 3 -port 9092
//	postbox serve --streams kafka://127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094?replication_factor=3
//
// kfake keeps records in memory (and, with -dir, in files it reloads
// there), runs every broker in one process, and is meant for tests and
// measurements, not production.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	brokers := flag.Int("brokers", 1, "`number` of brokers")
	port := flag.Int("port", 9092, "the first broker's `port`; the others take the ports after it")
	dir := flag.String("dir", "", "`directory` to persist the data to (default: memory only)")
	flag.Parse()
	if *brokers < 1 || *port < 1 {
		fmt.Fprintln(os.Stderr, "kfakeserver: -brokers and -port must be positive")
		os.Exit(2)
	}
	ports := make([]int, *brokers)
	for i := range ports {
		ports[i] = *port + i
	}
	opts := []kfake.Opt{kfake.NumBrokers(*brokers), kfake.Ports(ports...)}
	if *dir != "" {
		opts = append(opts, kfake.DataDir(*dir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		log.Fatalf("kfakeserver: %v", err)
	}
	defer c.Close()
	fmt.Printf("kfakeserver: %d brokers at %s\n", *brokers, strings.Join(c.ListenAddrs(), ","))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
}
