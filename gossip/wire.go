package gossip

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
	"github.com/vmihailenco/msgpack/v5"
)

// WireVersion is the envelope version this build writes. MinWireVersion is
// the oldest it reads. Structs on the wire are msgpack maps with short keys,
// so fields are only ever added under the same version: an older decoder
// skips keys it does not know and a newer one leaves missing keys zero. The
// version is bumped only for a change an older decoder would misread, and
// messages of a version newer than WireVersion are dropped and counted
// (reason "version"), never guessed at.
const (
	WireVersion    = 1
	MinWireVersion = 1
)

// Kind says what an envelope carries (msg.Kind).
type Kind = msg.Kind

// Message kinds (msg.Kind*).
const (
	KindReport    = msg.KindReport
	KindNodeUsage = msg.KindNodeUsage
	KindPolicy    = msg.KindPolicy
	KindBorrow    = msg.KindBorrow
	KindLoan      = msg.KindLoan
	KindPing      = msg.KindPing
)

// envelope is the outer layer of every message.
type envelope struct {
	V       uint8              `msgpack:"v"`
	Kind    Kind               `msgpack:"k"`
	From    string             `msgpack:"n"`
	Region  string             `msgpack:"r"`
	Payload msgpack.RawMessage `msgpack:"p"`
	// Relay asks the receiver, a node of another region, to send the
	// message on to the other live nodes of its region (without this
	// flag). Older decoders skip the key: they deliver, never forward,
	// which is why a region is sent through its relay only when all its
	// nodes advertise nodeMeta.Relays.
	Relay bool `msgpack:"f,omitempty"`
}

// The payloads and the decoded message are the coordinator's message
// types (package msg); gossip encodes and decodes them.
type (
	NodeUsage    = msg.NodeUsage
	KeyUsage     = msg.KeyUsage
	PolicyUpdate = msg.PolicyUpdate
	Message      = msg.Message
)

// Reasons a received message is dropped. Those of a message that is
// rejected (it arrived whole, but is not one this node may apply) label
// sluice_gossip_rejected_total; queue_full, auth and self label
// sluice_gossip_dropped_total.
const (
	ReasonMalformed = "malformed" // not msgpack, truncated, wrong types, a field twice
	ReasonVersion   = "version"   // envelope or layout version unknown (newer or zero)
	ReasonKind      = "kind"      // unknown message kind
	ReasonInvalid   = "invalid"   // decodes, but inconsistent (no sender, region mismatch, unsorted counter)
	ReasonOversized = "oversized" // larger than MaxMessageSize
	ReasonLimit     = "limit"     // more keys, counters or components than the caps, or a name too long
	ReasonValue     = "value"     // a float not finite or out of range, a count above MaxQuotaCount
	ReasonEpoch     = "epoch"     // an epoch or quota window too far from this node's clock
	ReasonRevision  = "revision"  // a policy revision from the future of this node's clock
	ReasonSender    = "sender"    // the sending node is not a live member
	ReasonRegion    = "region"    // the message names another region than the sender's membership metadata, or one it may not speak for

	ReasonQueueFull = "queue_full" // receive queue full
	ReasonAuth      = "auth"       // memberlist could not decrypt it (wrong or no key)
	ReasonSelf      = "self"       // our own message came back
)

// DecodeError is returned by Decode and Check; Reason is one of the Reason*
// values.
type DecodeError struct {
	Reason string
	Err    error
}

func (e *DecodeError) Error() string { return "gossip: " + e.Reason + ": " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

func decodeErr(reason string, err error) error { return &DecodeError{Reason: reason, Err: err} }

// Encode returns the wire form of payload (a share.Report, NodeUsage,
// PolicyUpdate, share.BorrowRequest, share.Loan or msg.Ping, by value)
// sent by node from in region.
func Encode(from, region string, payload any) ([]byte, error) {
	b, _, err := encode(from, region, payload, false)
	return b, err
}

// encode is Encode that, with relayed set, also returns the message
// flagged for relay (envelope.Relay); the payload is marshalled once.
func encode(from, region string, payload any, relayed bool) (direct, relay []byte, err error) {
	var kind Kind
	switch payload.(type) {
	case share.Report:
		kind = KindReport
	case NodeUsage:
		kind = KindNodeUsage
	case PolicyUpdate:
		kind = KindPolicy
	case share.BorrowRequest:
		kind = KindBorrow
	case share.Loan:
		kind = KindLoan
	case msg.Ping:
		kind = KindPing
	default:
		return nil, nil, fmt.Errorf("gossip: cannot encode %T", payload)
	}
	p, err := marshal(payload)
	if err != nil {
		return nil, nil, err
	}
	env := envelope{V: WireVersion, Kind: kind, From: from, Region: region, Payload: p}
	if direct, err = marshal(env); err != nil || !relayed {
		return direct, nil, err
	}
	env.Relay = true
	relay, err = marshal(env)
	return direct, relay, err
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	enc.UseCompactInts(true)
	enc.UseCompactFloats(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("gossip: encode: %w", err)
	}
	return buf.Bytes(), nil
}

// readErr names the drop reason of a reader error.
func readErr(err error) error {
	if errors.Is(err, errLimit) {
		return decodeErr(ReasonLimit, err)
	}
	return decodeErr(ReasonMalformed, err)
}

// Decode parses one message of at most maxSize bytes (0: no limit) and
// checks what it can without a clock or a member list: names, layout
// versions, caps (MaxKeys and its siblings), finite in-range figures and
// well-formed counters. Every failure is a *DecodeError naming the drop
// reason. It never panics and allocates at most a small multiple of len(b),
// however hostile b is (FuzzDecode and the per-kind fuzz targets).
func Decode(b []byte, maxSize int) (m Message, err error) {
	m, _, err = decode(b, maxSize)
	return m, err
}

// decode is Decode that also returns the envelope as read (its Payload a
// slice of b), for the relay flag and for forwarding.
func decode(b []byte, maxSize int) (m Message, env envelopeView, err error) {
	defer func() {
		if r := recover(); r != nil { // belt and braces: a decoder bug drops one message, not the node
			m, err = Message{}, decodeErr(ReasonMalformed, fmt.Errorf("panic: %v", r))
		}
	}()
	if maxSize > 0 && len(b) > maxSize {
		return Message{}, env, decodeErr(ReasonOversized, fmt.Errorf("%d bytes > %d", len(b), maxSize))
	}
	if err := decodeWhole(b, func(r *reader) error { return r.envelope(&env) }); err != nil {
		return Message{}, env, readErr(err)
	}
	m, err = decodePayload(b, env)
	return m, env, err
}

// decodePayload decodes and checks the payload of env, read from b.
func decodePayload(b []byte, env envelopeView) (m Message, err error) {
	// From here on a failure returns the header, for the log line.
	hdr := Message{Version: env.V, Kind: env.Kind, From: env.From, Region: env.Region, Size: len(b)}
	if env.V < MinWireVersion || env.V > WireVersion {
		return hdr, decodeErr(ReasonVersion, fmt.Errorf("version %d not in [%d,%d]", env.V, MinWireVersion, WireVersion))
	}
	if env.From == "" || env.Region == "" {
		return hdr, decodeErr(ReasonInvalid, errors.New("no sender or region"))
	}
	if len(env.Payload) == 0 || env.Payload[0] == 0xc0 {
		return hdr, decodeErr(ReasonMalformed, errors.New("no payload"))
	}
	m = hdr
	var check func() error
	switch env.Kind {
	case KindReport:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.report(&m.Report) })
		check = func() error { return checkReport(m.Report, env.Region) }
	case KindNodeUsage:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.nodeUsage(&m.Usage) })
		check = func() error { return checkNodeUsage(m.Usage, env.From, env.Region) }
	case KindPolicy:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.policy(&m.Policy) })
		check = func() error { return nil }
	case KindBorrow:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.borrow(&m.Borrow) })
		check = func() error { return checkBorrow(m.Borrow, env.Region) }
	case KindLoan:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.loan(&m.Loan) })
		check = func() error { return checkLoan(m.Loan, env.Region) }
	case KindPing:
		err = decodeWhole(env.Payload, func(r *reader) error { return r.ping(&m.Ping) })
		check = func() error { return checkPing(m.Ping) }
	default:
		return hdr, decodeErr(ReasonKind, fmt.Errorf("unknown kind %d", env.Kind))
	}
	if err != nil {
		return hdr, readErr(err)
	}
	if err := check(); err != nil {
		return hdr, err
	}
	return m, nil
}

// MaxRate bounds every rate in a report or node usage, in units per second
// (a limit, offered, recent, demand or admitted figure): far above any real
// limit, and small enough that summing the figures of every node and region
// stays finite.
const MaxRate = 1e15

// rate reports whether v is a finite rate in [0, MaxRate].
func rate(v float64) bool { return v >= 0 && v <= MaxRate }

// fraction reports whether v is a finite fraction in [0, 1].
func fraction(v float64) bool { return v >= 0 && v <= 1 }

func checkReport(r share.Report, region string) error {
	if r.Version > share.ReportVersion {
		return decodeErr(ReasonVersion, fmt.Errorf("report layout %d > %d", r.Version, share.ReportVersion))
	}
	if r.Region != region {
		return decodeErr(ReasonInvalid, fmt.Errorf("report of region %q sent from region %q", r.Region, region))
	}
	for i, k := range r.Keys {
		if k.Policy == "" || k.Subject == "" {
			return decodeErr(ReasonInvalid, fmt.Errorf("key %d without policy or subject", i))
		}
		if !(k.Limit > 0) || !rate(k.Limit) || !rate(k.Offered) || !rate(k.Recent) || !rate(k.Demand) || !rate(k.Admitted) || !fraction(k.Share) {
			return decodeErr(ReasonValue, fmt.Errorf("key %s/%s: limit %v offered %v recent %v demand %v admitted %v share %v",
				k.Policy, k.Subject, k.Limit, k.Offered, k.Recent, k.Demand, k.Admitted, k.Share))
		}
	}
	return checkQuotas(r.Quotas, "")
}

func checkNodeUsage(u NodeUsage, from, region string) error {
	if u.Node != from || u.Region != region {
		return decodeErr(ReasonInvalid, errors.New("node usage sender mismatch"))
	}
	for i, k := range u.Keys {
		if k.Policy == "" || k.Subject == "" {
			return decodeErr(ReasonInvalid, fmt.Errorf("key %d without policy or subject", i))
		}
		if !(k.Limit > 0) || !rate(k.Limit) || !rate(k.Offered) || !rate(k.Recent) || !rate(k.Admitted) {
			return decodeErr(ReasonValue, fmt.Errorf("key %s/%s: limit %v offered %v recent %v admitted %v",
				k.Policy, k.Subject, k.Limit, k.Offered, k.Recent, k.Admitted))
		}
	}
	return checkQuotas(u.Quotas, from)
}

// checkQuotas checks received G-counters: each names its key, has a
// non-negative window and its components sorted by name without
// duplicates, each at most MaxQuotaCount, so that no counter's total wraps
// around. With only set (a NodeUsage), a counter must be that node's
// component alone.
func checkQuotas(qs []share.QuotaCounter, only string) error {
	for _, q := range qs {
		if q.Policy == "" || q.Subject == "" {
			return decodeErr(ReasonInvalid, errors.New("quota counter without policy or subject"))
		}
		if q.Window < 0 {
			return decodeErr(ReasonEpoch, fmt.Errorf("quota counter %s/%s: window %d", q.Policy, q.Subject, q.Window))
		}
		if only != "" && (len(q.Counts) != 1 || q.Counts[0].Region != only) {
			return decodeErr(ReasonInvalid, fmt.Errorf("quota counter %s/%s: components not of node %q alone", q.Policy, q.Subject, only))
		}
		for i, c := range q.Counts {
			if c.Region == "" || (i > 0 && q.Counts[i-1].Region >= c.Region) {
				return decodeErr(ReasonInvalid, fmt.Errorf("quota counter %s/%s: components unsorted, repeated or unnamed", q.Policy, q.Subject))
			}
			if c.Count > MaxQuotaCount {
				return decodeErr(ReasonValue, fmt.Errorf("quota counter %s/%s: component %q of %d > %d", q.Policy, q.Subject, c.Region, c.Count, uint64(MaxQuotaCount)))
			}
		}
	}
	return nil
}

// checkPing validates a decoded contact ping: its answer address, if any,
// is a host and a port.
func checkPing(p msg.Ping) error {
	if p.Addr == "" {
		return nil
	}
	if _, err := mlNode(Member{Addr: p.Addr}); err != nil {
		return decodeErr(ReasonInvalid, fmt.Errorf("ping answer address %q: %w", p.Addr, err))
	}
	return nil
}

// checkBorrow validates a decoded BorrowRequest sent from region. The
// layout's own version (share.BorrowVersion) must be one this build knows:
// fields are only added under a version, so an unknown one is a change this
// build would misread.
func checkBorrow(r share.BorrowRequest, region string) error {
	switch {
	case r.Version < 1 || r.Version > share.BorrowVersion:
		return decodeErr(ReasonVersion, fmt.Errorf("borrow request version %d not in [1,%d]", r.Version, share.BorrowVersion))
	case r.Region != region:
		return decodeErr(ReasonInvalid, fmt.Errorf("borrow request of region %q sent from region %q", r.Region, region))
	case r.Policy == "" || r.Subject == "":
		return decodeErr(ReasonInvalid, errors.New("borrow request without key"))
	case !(r.Want > 0 && r.Want <= 1): // NaN fails too; no region can use more than the whole limit
		return decodeErr(ReasonValue, fmt.Errorf("borrow request wants %v of the limit", r.Want))
	}
	return nil
}

// checkLoan validates a decoded Loan sent from region (the lender's).
func checkLoan(l share.Loan, region string) error {
	switch {
	case l.Version < 1 || l.Version > share.BorrowVersion:
		return decodeErr(ReasonVersion, fmt.Errorf("loan version %d not in [1,%d]", l.Version, share.BorrowVersion))
	case l.Lender != region:
		return decodeErr(ReasonInvalid, fmt.Errorf("loan of region %q sent from region %q", l.Lender, region))
	case l.Borrower == "" || l.Borrower == l.Lender:
		return decodeErr(ReasonInvalid, fmt.Errorf("loan from %q to %q", l.Lender, l.Borrower))
	case l.Policy == "" || l.Subject == "":
		return decodeErr(ReasonInvalid, errors.New("loan without key"))
	case !(l.Amount > 0 && l.Amount <= 1):
		return decodeErr(ReasonValue, fmt.Errorf("loan of %v of the limit", l.Amount))
	case !(l.Tokens >= 0 && l.Tokens <= l.Amount): // the cut of Amount frees at most Amount·L tokens
		return decodeErr(ReasonValue, fmt.Errorf("loan hands over %v s of the limit with %v of it", l.Tokens, l.Amount))
	}
	return nil
}

// nodeMeta is the memberlist node metadata: at most 512 bytes.
type nodeMeta struct {
	V       uint8  `msgpack:"v"`
	Region  string `msgpack:"r"`
	Leaving bool   `msgpack:"l,omitempty"`
	// PolicyRev and PolicyHash advertise the policy set this node enforces
	// (SetPolicyVersion), so GET /v1/regions can show version skew.
	PolicyRev  uint64 `msgpack:"p,omitempty"`
	PolicyHash string `msgpack:"h,omitempty"`
	// Relays advertises that this node forwards relayed messages
	// (envelope.Relay) inside its region.
	Relays bool `msgpack:"f,omitempty"`
	// Pings advertises that this node answers contact pings of its own
	// (KindPing); a node of an older build is pinged through memberlist's
	// Ping instead.
	Pings bool `msgpack:"c,omitempty"`
}

func decodeMeta(b []byte) (nodeMeta, bool) {
	var m nodeMeta
	if len(b) == 0 || decodeWhole(b, func(r *reader) error { return r.meta(&m) }) != nil || m.Region == "" {
		return nodeMeta{}, false
	}
	return m, true
}

// unrelayed returns the wire form of env without the relay flag: what a
// relay sends on inside its region, byte for byte what the sender would
// have sent each node directly.
func unrelayed(env envelopeView) ([]byte, error) {
	return marshal(envelope{V: env.V, Kind: env.Kind, From: env.From, Region: env.Region, Payload: env.Payload})
}
