package poll

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkDecode measures decoding one page of 1,000 items.
func BenchmarkDecode(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := 1; i <= 1000; i++ {
		if i > 1 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"id":"ev-%07d","type":"push","created_at":%d,"repo":{"id":%d,"name":"postbox-events/postbox"},"actor":{"login":"user%d"}}`,
			i, 1700000000+i, i%97, i%13)
	}
	sb.WriteString(`],"next_cursor":"1000"}`)
	body := []byte(sb.String())
	items := "/events"
	p, err := New(Config{Name: "b", Sink: nopSink{}, Settings: Settings{URL: "http://x/", Items: &items, ID: "/id", Type: "/type",
		Time: "/created_at", CursorParam: "after", Next: "/next_cursor"}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := p.decode(body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "items/s")
}
