package gossip

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
	"github.com/vmihailenco/msgpack/v5"
)

func testReport(region string, epoch uint64, keys int) share.Report {
	r := share.Report{Version: share.ReportVersion, Region: region, Epoch: epoch}
	for i := range keys {
		r.Keys = append(r.Keys, share.KeyReport{
			Key:   share.Key{Policy: "api-global", Subject: fmt.Sprintf("key_%016x", i*7919)},
			Limit: 1000, Offered: 412.3 + float64(i), Recent: 530.1, Demand: 470.77, Admitted: 333.3, Share: 0.4137,
		})
	}
	return r
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	q := share.QuotaCounter{Key: share.Key{Policy: "daily", Subject: "u1"}, Window: 20000}
	q.Add(20000, "eu", 5)
	rep := testReport("eu", 42, 3)
	rep.Quotas = []share.QuotaCounter{q}
	tests := []struct {
		name    string
		payload any
		check   func(Message) any
	}{
		{"report", rep, func(m Message) any { return m.Report }},
		{"node usage", NodeUsage{Node: "n1", Region: "eu", Epoch: 7, Keys: []KeyUsage{{Key: share.Key{Policy: "p", Subject: "s"}, Limit: 10, Offered: 4, Recent: 5, Admitted: 3}}},
			func(m Message) any { return m.Usage }},
		{"node usage with quotas", NodeUsage{Node: "n1", Region: "eu", Epoch: 7, Quotas: []share.QuotaCounter{{Key: q.Key, Window: 20000, Counts: []share.RegionCount{{Region: "n1", Count: 5}}}}},
			func(m Message) any { return m.Usage }},
		{"policy", PolicyUpdate{Version: 9, Data: []byte(`{"policies":[]}`)}, func(m Message) any { return m.Policy }},
		{"borrow", testBorrow("eu"), func(m Message) any { return m.Borrow }},
		{"loan", testLoan("eu", "us"), func(m Message) any { return m.Loan }},
		{"contact ping", msg.Ping{Seq: 1 << 63, Addr: "10.0.0.7:7946"}, func(m Message) any { return m.Ping }},
		{"contact ping's answer", msg.Ping{Seq: 3, Ack: true}, func(m Message) any { return m.Ping }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Encode("n1", "eu", tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Decode(b, 0)
			if err != nil {
				t.Fatalf("Decode = %v", err)
			}
			if m.From != "n1" || m.Region != "eu" || m.Version != WireVersion || m.Size != len(b) {
				t.Errorf("Decode envelope = %+v", m)
			}
			if got := tt.check(m); !reflect.DeepEqual(got, tt.payload) {
				t.Errorf("Decode payload = %+v, want %+v", got, tt.payload)
			}
		})
	}
}

func testBorrow(region string) share.BorrowRequest {
	return share.BorrowRequest{Version: share.BorrowVersion, Region: region, Epoch: 177_000_123,
		Key: share.Key{Policy: "api-global", Subject: "key_00000000deadbeef"}, Want: 0.37, Burst: true}
}

func testLoan(lender, borrower string) share.Loan {
	return share.Loan{Version: share.BorrowVersion, Lender: lender, Borrower: borrower, Epoch: 177_000_123,
		Key: share.Key{Policy: "api-global", Subject: "key_00000000deadbeef"}, Amount: 0.4137, Tokens: 0.2, Seq: 12}
}

// The layouts an older build wrote: fewer fields. A current decoder must
// read them (missing fields zero) during a rolling upgrade.
type oldKeyReport struct {
	Policy  string  `msgpack:"p"`
	Subject string  `msgpack:"s"`
	Limit   float64 `msgpack:"l"`
	Offered float64 `msgpack:"o"`
	Share   float64 `msgpack:"f"`
}
type oldReport struct {
	Version uint8          `msgpack:"v"`
	Region  string         `msgpack:"r"`
	Epoch   uint64         `msgpack:"e"`
	Keys    []oldKeyReport `msgpack:"k"`
}
type oldEnvelope struct {
	V       uint8              `msgpack:"v"`
	Kind    Kind               `msgpack:"k"`
	From    string             `msgpack:"n"`
	Region  string             `msgpack:"r"`
	Payload msgpack.RawMessage `msgpack:"p"`
}

// A newer build may add fields; the current decoder skips them.
type newerEnvelope struct {
	oldEnvelope
	Trace string `msgpack:"t"`
	Hops  int    `msgpack:"h"`
}

func TestDecodeOlderAndNewerLayouts(t *testing.T) {
	old := oldReport{Version: 0, Region: "us", Epoch: 5, Keys: []oldKeyReport{{Policy: "g", Subject: "k1", Limit: 100, Offered: 80, Share: 0.5}}}
	p, _ := msgpack.Marshal(old)
	b, _ := msgpack.Marshal(oldEnvelope{V: MinWireVersion, Kind: KindReport, From: "old-node", Region: "us", Payload: p})
	m, err := Decode(b, 0)
	if err != nil {
		t.Fatalf("Decode(older layout) = %v", err)
	}
	want := share.KeyReport{Key: share.Key{Policy: "g", Subject: "k1"}, Limit: 100, Offered: 80, Share: 0.5}
	if len(m.Report.Keys) != 1 || m.Report.Keys[0] != want || m.Report.Epoch != 5 {
		t.Errorf("Decode(older layout) = %+v, want keys [%+v]", m.Report, want)
	}

	b, _ = msgpack.Marshal(newerEnvelope{oldEnvelope: oldEnvelope{V: WireVersion, Kind: KindPolicy, From: "new-node", Region: "us",
		Payload: mustMarshal(t, map[string]any{"v": 3, "d": []byte("x"), "sig": "future"})}, Trace: "abc", Hops: 2})
	m, err = Decode(b, 0)
	if err != nil || m.Policy.Version != 3 || string(m.Policy.Data) != "x" {
		t.Errorf("Decode(newer fields) = %+v, %v", m, err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeDrops(t *testing.T) {
	good, _ := Encode("n1", "eu", testReport("eu", 1, 2))
	env := func(e envelope) []byte { return mustMarshal(t, e) }
	payload := mustMarshal(t, testReport("eu", 1, 1))
	tests := []struct {
		name   string
		in     []byte
		max    int
		reason string
	}{
		{"empty", nil, 0, ReasonMalformed},
		{"random", []byte{0xde, 0xad, 0xbe, 0xef}, 0, ReasonMalformed},
		{"truncated", good[:len(good)-5], 0, ReasonMalformed},
		{"trailing", append(append([]byte{}, good...), 0xc0), 0, ReasonMalformed},
		{"oversized", good, len(good) - 1, ReasonOversized},
		{"newer version", env(envelope{V: WireVersion + 1, Kind: KindReport, From: "n", Region: "eu", Payload: payload}), 0, ReasonVersion},
		{"version zero", env(envelope{V: 0, Kind: KindReport, From: "n", Region: "eu", Payload: payload}), 0, ReasonVersion},
		{"unknown kind", env(envelope{V: WireVersion, Kind: 99, From: "n", Region: "eu", Payload: payload}), 0, ReasonKind},
		{"no sender", env(envelope{V: WireVersion, Kind: KindReport, Region: "eu", Payload: payload}), 0, ReasonInvalid},
		{"region mismatch", env(envelope{V: WireVersion, Kind: KindReport, From: "n", Region: "us", Payload: payload}), 0, ReasonInvalid},
		{"payload wrong type", env(envelope{V: WireVersion, Kind: KindReport, From: "n", Region: "eu", Payload: mustMarshal(t, "str")}), 0, ReasonMalformed},
		{"payload missing", env(envelope{V: WireVersion, Kind: KindPolicy, From: "n", Region: "eu"}), 0, ReasonMalformed},
		{"borrow newer layout", borrowEnv(func(r *share.BorrowRequest) { r.Version = share.BorrowVersion + 1 }), 0, ReasonVersion},
		{"borrow layout zero", borrowEnv(func(r *share.BorrowRequest) { r.Version = 0 }), 0, ReasonVersion},
		{"borrow region mismatch", borrowEnv(func(r *share.BorrowRequest) { r.Region = "us" }), 0, ReasonInvalid},
		{"borrow no key", borrowEnv(func(r *share.BorrowRequest) { r.Subject = "" }), 0, ReasonInvalid},
		{"borrow NaN", borrowEnv(func(r *share.BorrowRequest) { r.Want = math.NaN() }), 0, ReasonValue},
		{"borrow +Inf", borrowEnv(func(r *share.BorrowRequest) { r.Want = math.Inf(1) }), 0, ReasonValue},
		{"borrow negative", borrowEnv(func(r *share.BorrowRequest) { r.Want = -0.1 }), 0, ReasonValue},
		{"borrow above the limit", borrowEnv(func(r *share.BorrowRequest) { r.Want = 1.37 }), 0, ReasonValue},
		{"borrow burst not a bool", env(envelope{V: WireVersion, Kind: KindBorrow, From: "n", Region: "eu", Payload: mustMarshal(t, map[string]any{
			"v": share.BorrowVersion, "r": "eu", "e": 1, "p": "api", "s": "k", "w": 0.5, "b": 7})}), 0, ReasonMalformed},
		{"borrow wrong type", env(envelope{V: WireVersion, Kind: KindBorrow, From: "n", Region: "eu", Payload: mustMarshal(t, []int{1})}), 0, ReasonMalformed},
		{"loan newer layout", loanEnv(func(l *share.Loan) { l.Version = share.BorrowVersion + 1 }), 0, ReasonVersion},
		{"loan lender mismatch", loanEnv(func(l *share.Loan) { l.Lender = "ap" }), 0, ReasonInvalid},
		{"loan to itself", loanEnv(func(l *share.Loan) { l.Borrower = "eu" }), 0, ReasonInvalid},
		{"loan no borrower", loanEnv(func(l *share.Loan) { l.Borrower = "" }), 0, ReasonInvalid},
		{"loan above the limit", loanEnv(func(l *share.Loan) { l.Amount = 1.5 }), 0, ReasonValue},
		{"loan NaN", loanEnv(func(l *share.Loan) { l.Amount = math.NaN() }), 0, ReasonValue},
		{"loan zero", loanEnv(func(l *share.Loan) { l.Amount = 0 }), 0, ReasonValue},
		{"loan tokens above its amount", loanEnv(func(l *share.Loan) { l.Tokens = l.Amount + 0.1 }), 0, ReasonValue},
		{"loan negative tokens", loanEnv(func(l *share.Loan) { l.Tokens = -0.1 }), 0, ReasonValue},
		{"loan NaN tokens", loanEnv(func(l *share.Loan) { l.Tokens = math.NaN() }), 0, ReasonValue},
		{"field twice", func() []byte {
			b := append([]byte{}, good...)
			b[0]++ // one more map entry: the kind again
			return append(b, 0xa1, 'k', byte(KindReport))
		}(), 0, ReasonMalformed},
		{"keys over the cap", env(envelope{V: WireVersion, Kind: KindReport, From: "n", Region: "ap", Payload: keysOverCap("ap")}), 0, ReasonLimit},
		{"report NaN", env(envelope{V: WireVersion, Kind: KindReport, From: "n", Region: "eu", Payload: mustMarshal(t, func() share.Report {
			r := testReport("eu", 1, 1)
			r.Keys[0].Recent = math.NaN()
			return r
		}())}), 0, ReasonValue},
		{"loan truncated", func() []byte { b := loanEnv(func(*share.Loan) {}); return b[:len(b)-3] }(), 0, ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.in, tt.max)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != tt.reason {
				t.Errorf("Decode(%s) = %v, want reason %q", tt.name, err, tt.reason)
			}
		})
	}
}

// borrowEnv and loanEnv encode a valid message from eu after edit.
func borrowEnv(edit func(*share.BorrowRequest)) []byte {
	r := testBorrow("eu")
	edit(&r)
	p, _ := msgpack.Marshal(r)
	b, _ := msgpack.Marshal(envelope{V: WireVersion, Kind: KindBorrow, From: "n", Region: "eu", Payload: p})
	return b
}

func loanEnv(edit func(*share.Loan)) []byte {
	l := testLoan("eu", "us")
	edit(&l)
	p, _ := msgpack.Marshal(l)
	b, _ := msgpack.Marshal(envelope{V: WireVersion, Kind: KindLoan, From: "n", Region: "eu", Payload: p})
	return b
}

// TestBorrowSize: borrow messages fit in one UDP packet with room to spare
// and stay within share's own size estimates.
func TestBorrowSize(t *testing.T) {
	for _, c := range []struct {
		name     string
		payload  any
		estimate int
	}{
		{"borrow", testBorrow("eu-west"), testBorrow("eu-west").EncodedSizeEstimate()},
		{"loan", testLoan("eu-west", "us-east"), testLoan("eu-west", "us-east").EncodedSizeEstimate()},
	} {
		b, err := Encode("node-a", "eu-west", c.payload)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := marshal(c.payload)
		t.Logf("%s: %d bytes (payload %d, share's estimate %d)", c.name, len(b), len(p), c.estimate)
		if len(p) > c.estimate || len(b) > MaxPacketPayload/4 {
			t.Errorf("%s: payload %d bytes (estimate %d), message %d bytes", c.name, len(p), c.estimate, len(b))
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, p := range []any{testReport("eu", 3, 2), NodeUsage{Node: "a", Region: "eu", Epoch: 1, Keys: []KeyUsage{{Limit: 1}}}, PolicyUpdate{Version: 1, Data: []byte("{}")},
		testBorrow("eu"), testLoan("eu", "us")} {
		b, relayed, _ := encode("a", "eu", p, true)
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(relayed)
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}) // array of 4G elements
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}) // map of 4G entries
	f.Fuzz(func(t *testing.T, b []byte) {
		m, env, err := decode(b, 1<<20)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason == "" {
				t.Fatalf("Decode error without reason: %v", err)
			}
			return
		}
		// What a relay sends on decodes as what it received.
		if out, err := unrelayed(env); err != nil {
			t.Fatalf("unrelayed of an accepted message: %v", err)
		} else if m2, env2, err := decode(out, 0); err != nil || env2.Relay || m2.Kind != m.Kind || m2.From != m.From || m2.Region != m.Region {
			t.Fatalf("unrelayed message decodes as %+v (relay %v), %v; want %+v", m2, env2.Relay, err, m)
		}
		if m.From == "" || m.Region == "" || m.Version < MinWireVersion || m.Version > WireVersion {
			t.Fatalf("Decode accepted %+v", m)
		}
		switch m.Kind {
		case KindBorrow:
			if r := m.Borrow; r.Region != m.Region || !(r.Want > 0 && r.Want <= 1) || r.Version != share.BorrowVersion {
				t.Fatalf("Decode accepted borrow request %+v from %s", r, m.Region)
			}
		case KindLoan:
			if l := m.Loan; l.Lender != m.Region || l.Borrower == "" || l.Borrower == l.Lender || !(l.Amount > 0 && l.Amount <= 1) ||
				!(l.Tokens >= 0 && l.Tokens <= l.Amount) || l.Version != share.BorrowVersion {
				t.Fatalf("Decode accepted loan %+v from %s", l, m.Region)
			}
		}
	})
}

// TestKeyReportSize measures the wire cost of one KeyReport, the figure the
// bandwidth arithmetic in the package doc rests on.
func TestKeyReportSize(t *testing.T) {
	for _, n := range []int{1, 1000, 5000} {
		b, err := Encode("node-a", "eu-west", testReport("eu-west", 1, n))
		if err != nil {
			t.Fatal(err)
		}
		empty, _ := Encode("node-a", "eu-west", testReport("eu-west", 1, 0))
		t.Logf("%d keys: %d bytes, %.1f bytes/key (envelope+header %d bytes)", n, len(b), float64(len(b)-len(empty))/float64(n), len(empty))
		if per := float64(len(b)-len(empty)) / float64(n); per > 110 {
			t.Errorf("%.1f bytes per KeyReport, the documented arithmetic assumes ≤ 110", per)
		}
	}
}

func BenchmarkEncodeReport(b *testing.B) {
	r := testReport("eu-west", 1, 5000)
	b.ReportAllocs()
	var n int
	for b.Loop() {
		buf, err := Encode("node-a", "eu-west", r)
		if err != nil {
			b.Fatal(err)
		}
		n = len(buf)
	}
	b.SetBytes(int64(n))
}

func BenchmarkDecodeReport(b *testing.B) {
	buf, _ := Encode("node-a", "eu-west", testReport("eu-west", 1, 5000))
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := Decode(buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}
