package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
)

// Caps on one decoded message. A msgpack header may claim any length; the
// decoder checks every claimed length against the bytes left before it
// allocates, and these caps bound what a message may hold however large it
// is, so decoding a message of MaxMessageSize (16 MiB) allocates at most a
// few times that (FuzzDecodeReport and its siblings measure it). A message
// above a cap is dropped whole (reason "limit").
const (
	// MaxKeys is the most keys one Report or NodeUsage lists: above the
	// 170 000 that fit in 16 MiB at 97 bytes per key.
	MaxKeys = 200_000
	// MaxQuotaCounters is the most global-quota counters one Report or
	// NodeUsage carries.
	MaxQuotaCounters = 100_000
	// MaxCounterComponents is the most components (regions, or nodes in a
	// NodeUsage) of one counter.
	MaxCounterComponents = 64
	// MaxComponents is the most counter components in one message, over all
	// its counters.
	MaxComponents = 200_000
	// MaxQuotaCount is the largest component of a counter (2^53 units):
	// MaxCounterComponents of them sum to 2^59, so a counter's total never
	// wraps around.
	MaxQuotaCount = 1 << 53
	// MaxNameLen bounds node, region and policy hash names in bytes.
	MaxNameLen = 1024
	// MaxKeyLen bounds a key's policy id and subject in bytes: far above
	// what the check path produces, since one overlong subject rejects the
	// whole report that lists it.
	MaxKeyLen = 1<<16 - 1
	// maxDepth bounds the nesting of values the decoder skips (fields of a
	// newer build it does not know).
	maxDepth = 32
)

var (
	errTruncated = errors.New("truncated")
	errLimit     = errors.New("limit")
)

// reader is a bounded msgpack reader over one message. Every length read
// from a header is checked against the bytes left before anything is
// allocated: each element of an array takes at least one byte and each map
// entry two, so no header can make it allocate more than the message holds.
// It reads what msgpack/v5 writes for the wire types (compact integers and
// floats included) and rejects duplicate struct fields.
type reader struct {
	b []byte
	i int
	// components counts counter components decoded so far (MaxComponents).
	components int
}

func (r *reader) left() int { return len(r.b) - r.i }

func (r *reader) byte() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

func (r *reader) n(k int) ([]byte, error) {
	if k < 0 || k > r.left() {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+k]
	r.i += k
	return s, nil
}

func (r *reader) uintN(size int) (uint64, error) {
	s, err := r.n(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
	return binary.BigEndian.Uint64(s), nil
}

// length reads a length of size bytes and checks that per·length bytes are
// left.
func (r *reader) length(size, per int) (int, error) {
	v, err := r.uintN(size)
	if err != nil {
		return 0, err
	}
	if v > uint64(r.left()/per) {
		return 0, fmt.Errorf("length %d beyond the %d bytes left", v, r.left())
	}
	return int(v), nil
}

// arrayLen reads an array header; nil is an empty array.
func (r *reader) arrayLen() (int, error) { return r.header("an array", 0x90, 0xdc, 1) }

// mapLen reads a map header; nil is an empty map.
func (r *reader) mapLen() (int, error) { return r.header("a map", 0x80, 0xde, 2) }

// header reads the header of an array or map, whose fix codes are fix to
// fix+0x0f and whose 16- and 32-bit length codes are c16 and c16+1, and
// checks that per bytes an element are left (1 an array element, 2 a map
// entry); nil is empty.
func (r *reader) header(what string, fix, c16 byte, per int) (int, error) {
	c, err := r.byte()
	if err != nil {
		return 0, err
	}
	switch {
	case c == 0xc0:
		return 0, nil
	case c >= fix && c <= fix+0x0f:
		n := int(c & 0x0f)
		if per*n > r.left() {
			return 0, errTruncated
		}
		return n, nil
	case c == c16:
		return r.length(2, per)
	case c == c16+1:
		return r.length(4, per)
	}
	return 0, fmt.Errorf("want %s, got 0x%02x", what, c)
}

// raw reads a str or bin value (nil: empty) without copying.
func (r *reader) raw() ([]byte, error) {
	c, err := r.byte()
	if err != nil {
		return nil, err
	}
	if c == 0xc0 {
		return nil, nil
	}
	k, ok, err := r.strLen(c)
	switch {
	case !ok:
		return nil, fmt.Errorf("want a string, got 0x%02x", c)
	case err != nil:
		return nil, err
	}
	return r.n(k)
}

// strLen reads the length of the str or bin value whose code is c (its
// bytes are not checked yet); ok is false when c is neither.
func (r *reader) strLen(c byte) (k int, ok bool, err error) {
	switch {
	case c >= 0xa0 && c <= 0xbf:
		return int(c & 0x1f), true, nil
	case c == 0xd9 || c == 0xc4:
		k, err = r.length(1, 1)
	case c == 0xda || c == 0xc5:
		k, err = r.length(2, 1)
	case c == 0xdb || c == 0xc6:
		k, err = r.length(4, 1)
	default:
		return 0, false, nil
	}
	return k, true, err
}

func (r *reader) str(max int) (string, error) {
	s, err := r.raw()
	if err != nil {
		return "", err
	}
	if len(s) > max {
		return "", fmt.Errorf("%w: string of %d bytes > %d", errLimit, len(s), max)
	}
	return string(s), nil
}

// number reads any msgpack integer or float: u is its value as an
// unsigned integer (ok false when negative or fractional), f as a float.
func (r *reader) number() (u uint64, i int64, f float64, kind byte, err error) {
	c, err := r.byte()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), int64(c), float64(c), 'u', nil
	case c >= 0xe0:
		i = int64(int8(c))
		return 0, i, float64(i), 'i', nil
	case c >= 0xcc && c <= 0xcf:
		u, err = r.uintN(1 << (c - 0xcc))
		return u, int64(u), float64(u), 'u', err
	case c >= 0xd0 && c <= 0xd3:
		size := 1 << (c - 0xd0)
		v, err := r.uintN(size)
		switch size {
		case 1:
			i = int64(int8(v))
		case 2:
			i = int64(int16(v))
		case 4:
			i = int64(int32(v))
		default:
			i = int64(v)
		}
		if i >= 0 {
			return uint64(i), i, float64(i), 'u', err
		}
		return 0, i, float64(i), 'i', err
	case c == 0xca:
		v, err := r.uintN(4)
		return 0, 0, float64(math.Float32frombits(uint32(v))), 'f', err
	case c == 0xcb:
		v, err := r.uintN(8)
		return 0, 0, math.Float64frombits(v), 'f', err
	}
	return 0, 0, 0, 0, fmt.Errorf("want a number, got 0x%02x", c)
}

func (r *reader) uint(max uint64) (uint64, error) {
	u, i, _, kind, err := r.number()
	switch {
	case err != nil:
		return 0, err
	case kind != 'u':
		return 0, fmt.Errorf("want an unsigned integer, got %d (kind %c)", i, kind)
	case u > max:
		return 0, fmt.Errorf("%w: %d > %d", errLimit, u, max)
	}
	return u, nil
}

func (r *reader) int() (int64, error) {
	u, i, _, kind, err := r.number()
	switch {
	case err != nil:
		return 0, err
	case kind == 'f':
		return 0, errors.New("want an integer, got a float")
	case kind == 'u' && u > math.MaxInt64:
		return 0, fmt.Errorf("integer %d out of range", u)
	}
	return i, nil
}

// float reads a float; msgpack/v5 writes an integral float64 as an integer
// (UseCompactFloats).
func (r *reader) float() (float64, error) {
	_, _, f, _, err := r.number()
	return f, err
}

// bool reads a msgpack bool (nil reads as false).
func (r *reader) bool() (bool, error) {
	c, err := r.byte()
	if err != nil {
		return false, err
	}
	switch c {
	case 0xc2, 0xc0:
		return false, nil
	case 0xc3:
		return true, nil
	}
	return false, fmt.Errorf("want a bool, got 0x%02x", c)
}

// skip passes over one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nested too deep")
	}
	c, err := r.byte()
	if err != nil {
		return err
	}
	var k int // bytes to pass
	elems := 0
	switch {
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
	case c >= 0x80 && c <= 0x8f:
		elems = 2 * int(c&0x0f)
	case c >= 0x90 && c <= 0x9f:
		elems = int(c & 0x0f)
	case c == 0xc7:
		k, err = r.length(1, 1)
		k++
	case c == 0xc8:
		k, err = r.length(2, 1)
		k++
	case c == 0xc9:
		k, err = r.length(4, 1)
		k++
	case c == 0xca:
		k = 4
	case c == 0xcb:
		k = 8
	case c >= 0xcc && c <= 0xcf:
		k = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		k = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8:
		k = 1 + 1<<(c-0xd4)
	case c == 0xdc:
		elems, err = r.length(2, 1)
	case c == 0xdd:
		elems, err = r.length(4, 1)
	case c == 0xde:
		elems, err = r.length(2, 2)
		elems *= 2
	case c == 0xdf:
		elems, err = r.length(4, 2)
		elems *= 2
	default:
		var str bool
		if k, str, err = r.strLen(c); !str {
			return fmt.Errorf("unknown code 0x%02x", c)
		}
	}
	if err != nil {
		return err
	}
	if _, err := r.n(k); err != nil {
		return err
	}
	for range elems {
		if err := r.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// fields reads a struct written as a msgpack map: field is called with
// each key's name and reads its value (false: unknown, skipped). A known
// field seen twice is malformed, so no field is decoded (and allocated)
// twice.
func (r *reader) fields(field func(key string) (bool, error)) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var seen []string
	for range n {
		kb, err := r.raw()
		if err != nil {
			return fmt.Errorf("map key: %w", err)
		}
		key := string(kb)
		if slices.Contains(seen, key) {
			return fmt.Errorf("field %q twice", key)
		}
		known, err := field(key)
		if err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
		if known {
			seen = append(seen, key) // a struct has a handful of fields
		} else {
			if err := r.skip(0); err != nil {
				return fmt.Errorf("field %q: %w", key, err)
			}
		}
	}
	return nil
}

// array reads an array of at most max elements into a slice sized by its
// header (checked against the bytes left), each element by elem.
func array[T any](r *reader, max int, elem func(*T) error) ([]T, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, fmt.Errorf("%w: %d elements > %d", errLimit, n, max)
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]T, n)
	for i := range out {
		if err := elem(&out[i]); err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
	}
	return out, nil
}

// field names one msgpack map key of a wire struct and the struct field
// its value goes to. The target's type says how the value is read and what
// bounds it, the same for every struct:
//
//   - *string: a name of at most MaxNameLen bytes;
//   - *uint8, *Kind, *uint64: an unsigned integer the type holds;
//   - *int64: an integer; *float64: a number; *bool: a bool;
//   - *[]byte: a string or bin, copied (nil stays nil);
//   - *rawValue: any one value, kept as a slice of the message;
//   - *[]share.KeyReport, *[]KeyUsage (at most MaxKeys),
//     *[]share.QuotaCounter (MaxQuotaCounters) and *[]share.RegionCount
//     (MaxCounterComponents): arrays of those structs.
type field struct {
	key string
	to  any
}

// rawValue is a msgpack value left encoded: a slice of the message, not a
// copy.
type rawValue []byte

// record reads a struct written as a msgpack map into the targets of fs.
// key, when not nil, is an embedded share.Key whose fields p and s (each at
// most MaxKeyLen bytes) are the struct's own. A key neither names is a
// field of a newer build, skipped; a known key seen twice is malformed
// (fields).
func (r *reader) record(key *share.Key, fs ...field) error {
	return r.fields(func(name string) (bool, error) {
		for _, f := range fs {
			if f.key == name {
				return true, r.value(f.to)
			}
		}
		if key == nil {
			return false, nil
		}
		var err error
		switch name {
		case "p":
			key.Policy, err = r.str(MaxKeyLen)
		case "s":
			key.Subject, err = r.str(MaxKeyLen)
		default:
			return false, nil
		}
		return true, err
	})
}

// value reads one value into to, by to's type (field).
func (r *reader) value(to any) error {
	var err error
	var u uint64
	switch p := to.(type) {
	case *float64:
		*p, err = r.float()
	case *string:
		*p, err = r.str(MaxNameLen)
	case *uint64:
		*p, err = r.uint(math.MaxUint64)
	case *uint8:
		u, err = r.uint(math.MaxUint8)
		*p = uint8(u)
	case *Kind:
		u, err = r.uint(math.MaxUint8)
		*p = Kind(u)
	case *int64:
		*p, err = r.int()
	case *bool:
		*p, err = r.bool()
	case *[]byte:
		var b []byte
		if b, err = r.raw(); err == nil && b != nil {
			*p = append([]byte{}, b...)
		}
	case *rawValue:
		start := r.i
		if err = r.skip(0); err == nil {
			*p = r.b[start:r.i]
		}
	case *[]share.KeyReport:
		*p, err = array(r, MaxKeys, r.keyReport)
	case *[]KeyUsage:
		*p, err = array(r, MaxKeys, r.keyUsage)
	case *[]share.QuotaCounter:
		*p, err = array(r, MaxQuotaCounters, r.quotaCounter)
	case *[]share.RegionCount:
		*p, err = array(r, MaxCounterComponents, r.regionCount)
	default:
		panic(fmt.Sprintf("gossip: no reader for a field of type %T", to))
	}
	return err
}

type envelopeView struct {
	V       uint8
	Kind    Kind
	From    string
	Region  string
	Payload []byte // a slice of the message, not a copy
	Relay   bool
}

func (r *reader) envelope(e *envelopeView) error {
	return r.record(nil, field{"v", &e.V}, field{"k", &e.Kind}, field{"n", &e.From}, field{"r", &e.Region},
		field{"p", (*rawValue)(&e.Payload)}, field{"f", &e.Relay})
}

func (r *reader) report(rep *share.Report) error {
	return r.record(nil, field{"v", &rep.Version}, field{"r", &rep.Region}, field{"e", &rep.Epoch},
		field{"k", &rep.Keys}, field{"q", &rep.Quotas})
}

func (r *reader) keyReport(k *share.KeyReport) error {
	return r.record(&k.Key, field{"l", &k.Limit}, field{"o", &k.Offered}, field{"x", &k.Recent},
		field{"d", &k.Demand}, field{"a", &k.Admitted}, field{"f", &k.Share})
}

func (r *reader) quotaCounter(q *share.QuotaCounter) error {
	return r.record(&q.Key, field{"w", &q.Window}, field{"n", &q.Counts})
}

func (r *reader) regionCount(c *share.RegionCount) error {
	if r.components++; r.components > MaxComponents {
		return fmt.Errorf("%w: more than %d counter components", errLimit, MaxComponents)
	}
	return r.record(nil, field{"r", &c.Region}, field{"c", &c.Count})
}

func (r *reader) nodeUsage(u *NodeUsage) error {
	return r.record(nil, field{"n", &u.Node}, field{"r", &u.Region}, field{"e", &u.Epoch},
		field{"k", &u.Keys}, field{"q", &u.Quotas})
}

func (r *reader) keyUsage(k *KeyUsage) error {
	return r.record(&k.Key, field{"l", &k.Limit}, field{"o", &k.Offered}, field{"x", &k.Recent},
		field{"a", &k.Admitted})
}

func (r *reader) policy(p *PolicyUpdate) error {
	return r.record(nil, field{"v", &p.Version}, field{"d", &p.Data})
}

func (r *reader) borrow(b *share.BorrowRequest) error {
	return r.record(&b.Key, field{"v", &b.Version}, field{"r", &b.Region}, field{"e", &b.Epoch},
		field{"w", &b.Want}, field{"b", &b.Burst})
}

func (r *reader) loan(l *share.Loan) error {
	return r.record(&l.Key, field{"v", &l.Version}, field{"r", &l.Lender}, field{"b", &l.Borrower},
		field{"e", &l.Epoch}, field{"a", &l.Amount}, field{"x", &l.Tokens}, field{"n", &l.Seq})
}

func (r *reader) ping(p *msg.Ping) error {
	return r.record(nil, field{"s", &p.Seq}, field{"a", &p.Ack}, field{"d", &p.Addr})
}

func (r *reader) meta(m *nodeMeta) error {
	return r.record(nil, field{"v", &m.V}, field{"r", &m.Region}, field{"l", &m.Leaving},
		field{"p", &m.PolicyRev}, field{"h", &m.PolicyHash}, field{"f", &m.Relays}, field{"c", &m.Pings})
}

// decodeWhole runs read over all of b: trailing bytes are malformed.
func decodeWhole(b []byte, read func(*reader) error) error {
	r := &reader{b: b}
	if err := read(r); err != nil {
		return err
	}
	if r.left() != 0 {
		return errors.New("trailing bytes")
	}
	return nil
}
