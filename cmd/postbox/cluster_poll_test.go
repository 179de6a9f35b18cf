package main_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/testenv"
)

var pollPages = regexp.MustCompile(`(?m)^postbox_poll_pages_total\{source="gh"\} (\S+)$`)

// polledPages returns the pages node stored for the source gh (its
// postbox_poll_pages_total), -1 when it does not answer.
func (n *clusterNode) polledPages() float64 {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(n.url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := pollPages.FindStringSubmatch(string(b))
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	return f
}

// TestClusterPollSource: on two nodes sharing a PostgreSQL store (streams
// on JetStream), a poll source is polled by one node only; when that node
// is killed with SIGKILL mid-way, the other takes it over from the
// checkpoint, and every item of the fake API is stored once.
func TestClusterPollSource(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	store := clusterSchema(t)
	ns := natstest.StartServer(t, natstest.Options{})
	streams := ns.URL() + fmt.Sprintf("?prefix=POLL_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9)
	api := &crashAPI{served: map[int]int{}, odd: map[string]bool{}}
	ts := httptest.NewServer(api)
	defer ts.Close()
	nodes := []*clusterNode{startNode(t, "n1", store, streams), startNode(t, "n2", store, streams)}
	for _, n := range nodes {
		n.waitReady(nodes)
	}
	out, errOut, code := runCLI(t, nodes[1].url, "sources", "create", "gh", "--poll", ts.URL+"/events", "--items", "/events", "--id", "/id",
		"--type", "/type", "--cursor-param", "after", "--next", "/next_cursor", "--interval", "50ms")
	if code != 0 {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 60*time.Second, "20 pages answered", func() bool { return api.answered() >= 20 })
	var poller, other *clusterNode
	for i, n := range nodes {
		if n.polledPages() > 0 {
			if poller != nil {
				t.Fatalf("both nodes poll gh%s", nodeLogs(nodes))
			}
			poller, other = n, nodes[1-i]
		}
	}
	if poller == nil {
		t.Fatalf("no node polls gh%s", nodeLogs(nodes))
	}
	t.Logf("%s polls; killing it after %d pages", poller.name, api.answered())
	poller.kill()
	last := strconv.Itoa((crashPages - 1) * crashPerPage)
	testenv.Eventually(t, 120*time.Second, "the other node to store every item", func() bool {
		return streamLast(other.url, "gh") == crashPages*crashPerPage && sourceCursor(other.url, "gh") == last
	})
	if other.polledPages() == 0 {
		t.Errorf("%s stored no page after %s died", other.name, poller.name)
	}
	t.Logf("%d answers for %d pages", api.answered(), crashPages)
}

// sourceCursor returns the checkpoint cursor of a source at base.
func sourceCursor(base, name string) string {
	resp, err := http.Get(base + "/v1/sources/" + name)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`"cursor":"([^"]*)"`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}
