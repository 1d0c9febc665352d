package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/engine"
)

// chargeLua is charge.lua as written: its "-- <shared: NAME>" lines stand
// for parts of redis.lua.
//
//go:embed charge.lua
var chargeLua string

// chargeScript charges after the fact and keeps reservations; see its
// header. It is sent as its own call, never batched with checks.
var chargeScript = spliceShared(chargeLua, redisScript)

// spliceShared replaces each line "-- <shared: NAME>" of script by the
// lines of from between "-- <shared: NAME>" and "-- </shared: NAME>", so
// that two scripts run one text of the state layout they share. A part
// from does not have is a programming error, caught by every test that
// loads the package.
func spliceShared(script, from string) string {
	var b strings.Builder
	for line := range strings.Lines(script) {
		name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "-- <shared: ")
		name, ok2 := strings.CutSuffix(name, ">")
		if !ok || !ok2 {
			b.WriteString(line)
			continue
		}
		open, end := "-- <shared: "+name+">\n", "-- </shared: "+name+">\n"
		_, rest, found := strings.Cut(from, open)
		part, _, closed := strings.Cut(rest, end)
		if !found || !closed {
			panic("redisstore: redis.lua has no shared part " + name)
		}
		b.WriteString(part)
	}
	return b.String()
}

var chargeSHA = func() string {
	sum := sha1.Sum([]byte(chargeScript))
	return hex.EncodeToString(sum[:])
}()

// reservationKey is where subject's reservation id is kept: beside its
// states, under the same hash tag, and apart from every policy's key
// (those continue the tag with ":").
func (s *Store) reservationKey(subject, id string) string {
	return s.prefix + "{" + redisSubject(subject) + "}#r:" + id
}

// MinChargeTimeout is the least time a charge or a reservation is given:
// a charge comes after the response, where a few milliseconds more cost
// no request its deadline, and a server's first charge compiles the
// script.
const MinChargeTimeout = 100 * time.Millisecond

// evalCharge runs the charge script, loading it when the server does not
// hold it, within the store's timeout or MinChargeTimeout, the longer.
func (s *Store) evalCharge(ctx context.Context, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, MinChargeTimeout))
	defer cancel()
	now, pad := "", "0"
	if s.clock != nil {
		now, pad = strconv.FormatInt(s.clock.Now().UnixMicro(), 10), strconv.FormatInt(s.ttlPad, 10)
	}
	// The call is built as EvalSha builds it, numkeys a string (which
	// go-redis reads back to route it on a Cluster), and sent once
	// (onceCmd): a charge Redis ran must not be charged again.
	call := make([]any, 0, 3+len(keys)+2+len(args))
	call = append(call, "evalsha", chargeSHA, strconv.Itoa(len(keys)))
	for _, k := range keys {
		call = append(call, k)
	}
	call = append(append(call, now, pad), args...)
	cmd := redis.NewCmd(ctx, call...)
	err := s.c.Process(ctx, onceCmd{cmd})
	if isNoScript(err) {
		cmd = redis.NewCmd(ctx, evalCommand(call, chargeScript)...)
		err = s.c.Process(ctx, onceCmd{cmd})
	}
	v, err := cmd.Result()
	return v, callErr(ctx, err)
}

// Charge charges a request after the fact (engine.Charger): every policy,
// past its limit if need be, or, on an error, none.
func (s *Store) Charge(ctx context.Context, req engine.ChargeRequest) (engine.Decision, error) {
	if err := req.Validate(); err != nil {
		return engine.Decision{Decider: -1}, err
	}
	if s.cfgErr != nil {
		return engine.Decision{Decider: -1}, s.cfgErr
	}
	if r := (engine.Request{Subject: req.Subject, Checks: req.Checks}); s.cluster && r.Spans() {
		return engine.Decision{Decider: -1}, errSpansCluster
	}
	n := len(req.Checks)
	keys := make([]string, 0, n+1)
	args := make([]any, 0, 3+7*n)
	settle := "0"
	for i := range req.Checks {
		keys = append(keys, s.Key(req.Checks[i].SubjectOf(req.Subject), req.Checks[i].Policy))
	}
	if req.Reservation != "" {
		settle = "1"
		keys = append(keys, s.reservationKey(req.Subject, req.Reservation))
	}
	args = append(args, "c", n, settle)
	for i := range req.Checks {
		c := &req.Checks[i]
		l := c.Effective()
		p1, p2 := scriptLimit(&l)
		args = append(args, int(l.Algorithm), p1, p2, l.Window.Microseconds(), c.Cost, c.ScaleFactor(), c.Policy)
	}
	v, err := s.evalCharge(ctx, keys, args...)
	if err != nil {
		if redis.HasErrorPrefix(err, "unknown reservation") {
			return engine.Decision{Decider: -1}, fmt.Errorf("%w: %q", engine.ErrUnknownReservation, req.Reservation)
		}
		return engine.Decision{Decider: -1}, fmt.Errorf("redis charge for %q: %w", req.Subject, err)
	}
	return chargeDecision(req, v)
}

// chargeDecision reads the charge script's reply: now, then a, b and t of
// each policy's state as written, which engine.ChargeResult reads as the
// memory store does, and the estimate the settled reservation held for
// it (into req.Held when as long as the checks).
func chargeDecision(req engine.ChargeRequest, v any) (engine.Decision, error) {
	bad := func(why string) (engine.Decision, error) {
		return engine.Decision{Decider: -1}, fmt.Errorf("redis charge for %q: %s", req.Subject, why)
	}
	vals, ok := v.([]any)
	if !ok || len(vals) != 1+4*len(req.Checks) {
		return bad(fmt.Sprintf("script returned %T of unexpected shape", v))
	}
	now, ok := vals[0].(int64)
	if !ok {
		return bad("no time in the reply")
	}
	d := engine.Decision{N: len(req.Checks)}
	for i := range req.Checks {
		as, _ := vals[1+4*i].(string)
		bs, _ := vals[2+4*i].(string)
		t, tok := vals[3+4*i].(int64)
		est, eok := vals[4+4*i].(int64)
		a, aerr := strconv.ParseFloat(as, 64)
		b, berr := strconv.ParseFloat(bs, 64)
		if aerr != nil || berr != nil || !tok || !eok {
			return bad(fmt.Sprintf("policy %d's state unreadable", i))
		}
		if req.Reservation != "" && len(req.Held) == len(req.Checks) {
			req.Held[i] = est
		}
		d.Results[i] = engine.ChargeResult(time.UnixMicro(now), engine.State{A: a, B: b, T: t}, req.Checks[i].Effective())
	}
	d.Finish(nil)
	return d, nil
}

// Reserve records subject's estimate under each check's policy, to settle
// by id within ttl (engine.Reserver), on the server's clock.
func (s *Store) Reserve(ctx context.Context, subject, id string, checks []engine.Check, ttl time.Duration) error {
	if err := engine.ValidateReservation(subject, id, checks, ttl); err != nil {
		return err
	}
	costs := make(map[string]int64, len(checks))
	for i := range checks {
		costs[checks[i].Policy] = checks[i].Cost
	}
	js, err := json.Marshal(costs)
	if err != nil {
		return fmt.Errorf("redis reserve: %w", err)
	}
	if _, err := s.evalCharge(ctx, []string{s.reservationKey(subject, id)}, "r", ttl.Microseconds(), string(js)); err != nil {
		return fmt.Errorf("redis reserve for %q: %w", subject, err)
	}
	return nil
}
