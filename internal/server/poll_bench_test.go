package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// BenchmarkPollSource measures a source of kind poll end to end: serve
// (the SQLite default, synchronous FULL) polls a local fake API of
// 100,000 items in pages of 1,000 (rendered beforehand) and stores each
// page with its checkpoint in one transaction. It reports items stored
// per second, from the source's creation to the last item's commit.
//
//	go test -run '^$' -bench BenchmarkPollSource -benchtime 5x ./internal/server/
func BenchmarkPollSource(b *testing.B) {
	const pages, per = 100, 1000
	bodies := make([][]byte, pages)
	for p := range pages {
		var sb strings.Builder
		sb.WriteString(`{"events":[`)
		for i := p*per + 1; i <= (p+1)*per; i++ {
			if i > p*per+1 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"id":"ev-%07d","type":"push","created_at":%d,"repo":{"id":%d,"name":"postbox-events/postbox"},"actor":{"login":"user%d"}}`,
				i, 1700000000+i, i%97, i%13)
		}
		sb.WriteString(`],"next_cursor":`)
		if p < pages-1 {
			sb.WriteString(strconv.Quote(strconv.Itoa((p + 1) * per)))
		} else {
			sb.WriteString("null")
		}
		sb.WriteString("}")
		bodies[p] = []byte(sb.String())
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		w.Header().Set("Content-Type", "application/json")
		w.Write(bodies[min(after/per, pages-1)])
	}))
	defer api.Close()
	ts := servertest.Start(b, server.Config{}, nil)
	ctx := context.Background()
	var elapsed time.Duration
	for i := range b.N {
		name := fmt.Sprintf("bench%d", i)
		start := time.Now()
		st, body := srcCallB(b, ts, `{"name": "`+name+`", "kind": "poll", "settings": {"url": "`+api.URL+`/events", "items": "/events",
			"id": "/id", "type": "/type", "time": "/created_at", "cursor_param": "after", "next": "/next_cursor", "interval": "1h"}}`)
		if st != http.StatusCreated {
			b.Fatalf("create: %d %s", st, body)
		}
		for {
			s, err := ts.Srv.Streams().Stats(ctx, name)
			if err == nil && s.LastOffset >= pages*per {
				break
			}
			time.Sleep(time.Millisecond)
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(b.N*pages*per)/elapsed.Seconds(), "items/s")
}

// srcCallB posts a source to ts.
func srcCallB(b *testing.B, ts *servertest.Server, body string) (int, string) {
	resp, err := ts.HTTP.Post(ts.Base+"/v1/sources", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	fmt.Fprint(&sb, resp.Status)
	return resp.StatusCode, sb.String()
}
