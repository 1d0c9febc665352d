package gossip

import (
	"bytes"
	"encoding/binary"
	"math"
	"net"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	dto "github.com/prometheus/client_model/go"
	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
	"github.com/vmihailenco/msgpack/v5"
)

// rawEnvelope encodes an envelope around payload bytes, whatever they are.
func rawEnvelope(t testing.TB, kind Kind, from, region string, payload []byte) []byte {
	t.Helper()
	b, err := msgpack.Marshal(envelope{V: WireVersion, Kind: kind, From: from, Region: region, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hugeArrayReport is a report payload whose keys array claims 2^32-1
// elements and holds none.
func hugeArrayReport(region string) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x84, 0xa1, 'v', 0x01, 0xa1, 'r', byte(0xa0 | len(region))})
	b.WriteString(region)
	b.Write([]byte{0xa1, 'e', 0x64, 0xa1, 'k', 0xdd, 0xff, 0xff, 0xff, 0xff})
	return b.Bytes()
}

// keysOverCap is a report payload listing MaxKeys+1 empty keys: every
// header honest, the count over the cap.
func keysOverCap(region string) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x84, 0xa1, 'v', 0x01, 0xa1, 'r', byte(0xa0 | len(region))})
	b.WriteString(region)
	b.Write([]byte{0xa1, 'e', 0x64, 0xa1, 'k', 0xdd})
	_ = binary.Write(&b, binary.BigEndian, uint32(MaxKeys+1))
	b.Write(bytes.Repeat([]byte{0x80}, MaxKeys+1))
	return b.Bytes()
}

// TestHostileMessagesToLiveNode sends each hostile message to a live node
// (real memberlist on loopback) from a member holding the cluster key, and
// checks that each is rejected and counted under its reason, that nothing
// reaches the handlers, and that the region and policy sync they aimed to
// silence still work afterwards.
func TestHostileMessagesToLiveNode(t *testing.T) {
	t.Parallel()
	victim := startNode(t, "h-eu", "eu", keyA)
	us := startNode(t, "h-us", "us", keyA, victim.Addr())
	ap := startNode(t, "h-ap", "ap", keyA, victim.Addr()) // the insider
	testwait.For(t, 30*time.Second, "3 nodes to join", func() bool { return victim.NumLive() == 3 && ap.NumLive() == 3 && us.NumLive() == 3 })

	nowEpoch := uint64(testNow().UnixNano() / int64(DefaultInterval))
	report := func(region string, edit func(*share.Report)) []byte {
		r := testReport(region, nowEpoch, 1)
		if edit != nil {
			edit(&r)
		}
		p, err := msgpack.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := func(v uint64) []byte {
		p, _ := msgpack.Marshal(PolicyUpdate{Version: v, Data: []byte("evil")})
		return p
	}
	tests := []struct {
		name   string
		msg    []byte
		reason string
	}{
		{"array header of 2^32-1 keys", rawEnvelope(t, KindReport, "h-ap", "ap", hugeArrayReport("ap")), ReasonMalformed},
		{"map header of 2^32-1 entries", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v'}, ReasonMalformed},
		{"string header of 4 GiB", rawEnvelope(t, KindReport, "h-ap", "ap", []byte{0x81, 0xa1, 'r', 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}), ReasonMalformed},
		{"more keys than MaxKeys", rawEnvelope(t, KindReport, "h-ap", "ap", keysOverCap("ap")), ReasonLimit},
		{"report of a foreign region", rawEnvelope(t, KindReport, "h-ap", "us", report("us", nil)), ReasonRegion},
		{"report from no member", rawEnvelope(t, KindReport, "ghost", "ap", report("ap", nil)), ReasonSender},
		{"report epoch 2^64-1", rawEnvelope(t, KindReport, "h-ap", "ap", report("ap", func(r *share.Report) { r.Epoch = math.MaxUint64 })), ReasonEpoch},
		{"policy revision 2^64-1", rawEnvelope(t, KindPolicy, "h-ap", "ap", policy(math.MaxUint64)), ReasonRevision},
		{"G-counter that wraps its sum", rawEnvelope(t, KindReport, "h-ap", "ap", report("ap", func(r *share.Report) {
			r.Quotas = []share.QuotaCounter{{Key: share.Key{Policy: "daily", Subject: "u"}, Window: 1,
				Counts: []share.RegionCount{{Region: "ap", Count: 1 << 63}, {Region: "eu", Count: 1 << 63}}}}
		})), ReasonValue},
		{"NaN offered", rawEnvelope(t, KindReport, "h-ap", "ap", report("ap", func(r *share.Report) { r.Keys[0].Offered = math.NaN() })), ReasonValue},
		{"NaN share", rawEnvelope(t, KindReport, "h-ap", "ap", report("ap", func(r *share.Report) { r.Keys[0].Share = math.NaN() })), ReasonValue},
		{"+Inf limit", rawEnvelope(t, KindReport, "h-ap", "ap", report("ap", func(r *share.Report) { r.Keys[0].Limit = math.Inf(1) })), ReasonValue},
		{"node usage into another region", rawEnvelope(t, KindNodeUsage, "h-ap", "ap", mustMarshal(t, NodeUsage{Node: "h-ap", Region: "ap", Epoch: nowEpoch})), ReasonRegion},
		{"contact ping from no member, no answer address", rawEnvelope(t, KindPing, "ghost", "ap", mustMarshal(t, msg.Ping{Seq: 1})), ReasonSender},
		{"contact ping with a bad answer address", rawEnvelope(t, KindPing, "h-ap", "ap", mustMarshal(t, msg.Ping{Seq: 1, Addr: "nowhere"})), ReasonInvalid},
		{"contact ping claiming another region", rawEnvelope(t, KindPing, "h-ap", "us", mustMarshal(t, msg.Ping{Seq: 1})), ReasonRegion},
		{"contact ping with a negative sequence", rawEnvelope(t, KindPing, "h-ap", "ap", []byte{0x81, 0xa1, 's', 0xff}), ReasonMalformed},
	}
	host, port, _ := net.SplitHostPort(victim.Addr())
	p, _ := strconv.Atoi(port)
	target := &memberlist.Node{Name: "h-eu", Addr: net.ParseIP(host), Port: uint16(p)}
	for _, tt := range tests {
		before := dropped(victim, tt.reason)
		if err := ap.ml.SendReliable(target, tt.msg); err != nil {
			t.Fatalf("%s: send: %v", tt.name, err)
		}
		testwait.For(t, 30*time.Second, tt.name+" rejected as "+tt.reason, func() bool { return dropped(victim, tt.reason) >= before+1 })
	}

	victim.in.mu.Lock()
	reports, policies := len(victim.in.reports), len(victim.in.policies)
	victim.in.mu.Unlock()
	if reports != 0 || policies != 0 {
		t.Fatalf("hostile messages reached the handlers: %d reports, %d policies", reports, policies)
	}
	var rm dto.Metric
	if err := victim.metrics.received.WithLabelValues(KindReport.String()).Write(&rm); err != nil || rm.GetCounter().GetValue() != 0 {
		t.Errorf("received{report} = %v after only hostile messages, want 0 (%v)", rm.GetCounter().GetValue(), err)
	}

	// ap's real report and a real policy revision still get through: the
	// epoch and revision from the far future were not recorded.
	if err := ap.BroadcastReport(t.Context(), testReport("ap", nowEpoch, 2)); err != nil {
		t.Fatal(err)
	}
	pol := PolicyUpdate{Version: uint64(testNow().UnixMilli()) << 16, Data: []byte("good")}
	if err := us.BroadcastPolicy(t.Context(), pol); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "ap's real report and us's policy delivered", func() bool {
		victim.in.mu.Lock()
		defer victim.in.mu.Unlock()
		return len(victim.in.reports) == 1 && len(victim.in.policies) == 1
	})
	victim.in.mu.Lock()
	defer victim.in.mu.Unlock()
	if got := victim.in.reports[0]; !reflect.DeepEqual(got, testReport("ap", nowEpoch, 2)) {
		t.Errorf("delivered report = %+v", got)
	}
	if got := victim.in.policies[0]; !reflect.DeepEqual(got, pol) {
		t.Errorf("delivered policy = %+v, want %+v", got, pol)
	}
}

// allocBound is the most a Decode of any input of up to DefaultMaxMessageSize
// may allocate.
const allocBound = 64 << 20

// decodeAlloc returns the bytes Decode(b) allocates.
func decodeAlloc(b []byte) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _ = Decode(b, DefaultMaxMessageSize)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDecodeAllocationBound feeds Decode the 16 MiB messages that cost a
// trusting decoder most, one per kind, and checks that each allocates less
// than allocBound.
func TestDecodeAllocationBound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 16 MiB messages")
	}
	const size = DefaultMaxMessageSize - 64
	fill := func(head []byte, each []byte) []byte {
		b := append([]byte{}, head...)
		for len(b)+len(each) <= size {
			b = append(b, each...)
		}
		return b
	}
	array32 := func(n int) []byte { return []byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }
	// Report: MaxKeys keys that are empty maps (1 byte each, 80 bytes
	// decoded), then padding in an unknown field.
	keys := append([]byte{0x83, 0xa1, 'r', 0xa2, 'a', 'p', 0xa1, 'k'}, array32(MaxKeys)...)
	keys = append(keys, bytes.Repeat([]byte{0x80}, MaxKeys)...)
	keys = append(keys, 0xa1, 'z', 0xdb, 0, 0, 0, 0)
	pad := size - len(keys) - 64
	binary.BigEndian.PutUint32(keys[len(keys)-4:], uint32(pad))
	keys = append(keys, make([]byte, pad)...)
	// Counters: MaxQuotaCounters counters, as many components as allowed.
	var counters []byte
	counters = append(counters, 0x82, 0xa1, 'r', 0xa2, 'a', 'p', 0xa1, 'q')
	counters = append(counters, array32(MaxQuotaCounters)...)
	per := MaxComponents / MaxQuotaCounters
	for range MaxQuotaCounters {
		counters = append(counters, 0x81, 0xa1, 'n', byte(0x90|per))
		counters = append(counters, bytes.Repeat([]byte{0x80}, per)...)
	}
	// Strings: one key whose subject is as long as allowed, repeated in
	// an array of maps until the message is full.
	subject := append([]byte{0x81, 0xa1, 's', 0xda, byte(MaxKeyLen >> 8), byte(MaxKeyLen & 0xff)}, bytes.Repeat([]byte{'s'}, MaxKeyLen)...)
	nStrings := min(MaxKeys, (size-100)/len(subject))
	strs := append([]byte{0x82, 0xa1, 'r', 0xa2, 'a', 'p', 0xa1, 'k'}, array32(nStrings)...)
	for range nStrings {
		strs = append(strs, subject...)
	}
	// Both at once: MaxKeys keys, each with a subject as long as fits.
	per75 := (size - 100) / MaxKeys
	short := append([]byte{0x81, 0xa1, 's', 0xd9, byte(per75 - 6)}, bytes.Repeat([]byte{'s'}, per75-6)...)
	both := append([]byte{0x82, 0xa1, 'r', 0xa2, 'a', 'p', 0xa1, 'k'}, array32(MaxKeys)...)
	for range MaxKeys {
		both = append(both, short...)
	}
	data := append([]byte{0x82, 0xa1, 'v', 0x01, 0xa1, 'd', 0xc6}, binary.BigEndian.AppendUint32(nil, size-200)...)
	data = append(data, make([]byte, size-200)...)

	cases := []struct {
		name    string
		kind    Kind
		payload []byte
	}{
		{"report of empty keys", KindReport, keys},
		{"report of counters", KindReport, counters},
		{"report of long names", KindReport, strs},
		{"report of MaxKeys named keys", KindReport, both},
		{"node usage of empty keys", KindNodeUsage, keys},
		{"policy of 16 MiB", KindPolicy, data},
		{"borrow padded", KindBorrow, fill([]byte{0xdf, 0, 0, 0, 1, 0xa1, 'z', 0xdc, 0xff, 0xff}, []byte{0xc0})},
		{"loan of nested arrays", KindLoan, fill(nil, []byte{0x91})},
		{"array header of 2^32-1 keys", KindReport, hugeArrayReport("ap")},
	}
	for _, c := range cases {
		msg := rawEnvelope(t, c.kind, "n", "ap", c.payload)
		if len(msg) > DefaultMaxMessageSize {
			t.Fatalf("%s: test message is %d bytes", c.name, len(msg))
		}
		got := decodeAlloc(msg)
		t.Logf("%s: %d bytes in, %.1f MiB allocated", c.name, len(msg), float64(got)/(1<<20))
		if got > allocBound {
			t.Errorf("%s: Decode allocated %d bytes > %d", c.name, got, allocBound)
		}
	}
}

// fuzzKind fuzzes the payload of one message kind: Decode must not panic,
// must allocate less than allocBound, and what it accepts must hold the
// checks it promises.
func fuzzKind(f *testing.F, kind Kind, seeds ...any) {
	for _, s := range seeds {
		p, err := marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
		f.Add(p[:len(p)/2])
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add(hugeArrayReport("eu"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg := rawEnvelope(t, kind, "a", "eu", payload)
		if got := decodeAlloc(msg); got > allocBound {
			t.Fatalf("Decode of %d bytes allocated %d > %d", len(msg), got, allocBound)
		}
		m, err := Decode(msg, DefaultMaxMessageSize)
		if err != nil {
			return
		}
		if m.Kind != kind {
			t.Fatalf("Decode kind %v, want %v", m.Kind, kind)
		}
		checkAccepted(t, m)
	})
}

// checkAccepted fails if Decode accepted a message its checks promise to
// reject.
func checkAccepted(t *testing.T, m Message) {
	t.Helper()
	finite := func(vs ...float64) bool {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxRate {
				return false
			}
		}
		return true
	}
	quotas := func(qs []share.QuotaCounter) {
		for _, q := range qs {
			var sum uint64
			for _, c := range q.Counts {
				if sum+c.Count < sum {
					t.Fatalf("accepted a counter whose sum wraps: %+v", q)
				}
				sum += c.Count
			}
		}
	}
	switch m.Kind {
	case KindReport:
		if len(m.Report.Keys) > MaxKeys {
			t.Fatalf("accepted %d keys", len(m.Report.Keys))
		}
		for _, k := range m.Report.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Demand, k.Admitted, k.Share) || k.Share > 1 {
				t.Fatalf("accepted key %+v", k)
			}
		}
		quotas(m.Report.Quotas)
	case KindNodeUsage:
		for _, k := range m.Usage.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Admitted) {
				t.Fatalf("accepted key %+v", k)
			}
		}
		quotas(m.Usage.Quotas)
	case KindBorrow:
		if !finite(m.Borrow.Want) || m.Borrow.Want == 0 || m.Borrow.Want > 1 {
			t.Fatalf("accepted borrow %+v", m.Borrow)
		}
	case KindLoan:
		if !finite(m.Loan.Amount) || m.Loan.Amount == 0 || m.Loan.Amount > 1 || !finite(m.Loan.Tokens) || m.Loan.Tokens > m.Loan.Amount {
			t.Fatalf("accepted loan %+v", m.Loan)
		}
	}
}

func FuzzDecodeReport(f *testing.F) {
	q := share.QuotaCounter{Key: share.Key{Policy: "daily", Subject: "u1"}, Window: 20000}
	q.Add(20000, "eu", 5)
	r := testReport("eu", 42, 3)
	r.Quotas = []share.QuotaCounter{q}
	fuzzKind(f, KindReport, r, testReport("eu", 1, 0))
}

func FuzzDecodeNodeUsage(f *testing.F) {
	fuzzKind(f, KindNodeUsage, NodeUsage{Node: "a", Region: "eu", Epoch: 7, Keys: []KeyUsage{{Key: share.Key{Policy: "p", Subject: "s"}, Limit: 10, Offered: 4}},
		Quotas: []share.QuotaCounter{{Key: share.Key{Policy: "d", Subject: "s"}, Window: 3, Counts: []share.RegionCount{{Region: "a", Count: 5}}}}})
}

func FuzzDecodePolicy(f *testing.F) {
	fuzzKind(f, KindPolicy, PolicyUpdate{Version: 9, Data: []byte(`{"policies":[]}`)})
}

func FuzzDecodeBorrow(f *testing.F) { fuzzKind(f, KindBorrow, testBorrow("eu")) }

func FuzzDecodeLoan(f *testing.F) { fuzzKind(f, KindLoan, testLoan("eu", "us")) }

func FuzzDecodePing(f *testing.F) {
	fuzzKind(f, KindPing, msg.Ping{Seq: 7}, msg.Ping{Seq: math.MaxUint64, Ack: true})
}

// FuzzDecodeMeta: node metadata comes from any member; decodeMeta never
// panics and allocates little (under 64 KiB: the counter also sees the
// fuzzing engine's own allocations, so the bound is loose).
func FuzzDecodeMeta(f *testing.F) {
	b, _ := marshal(nodeMeta{V: 1, Region: "eu", PolicyRev: 7, PolicyHash: "abc", Relays: true})
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'r', 0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, ok := decodeMeta(b)
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > uint64(8*len(b)+64<<10) {
			t.Fatalf("decodeMeta of %d bytes allocated %d", len(b), got)
		}
		if ok && m.Region == "" {
			t.Fatalf("decodeMeta accepted %+v", m)
		}
	})
}
