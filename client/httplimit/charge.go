package httplimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/client"
)

// reserve makes req, the check before a handler whose cost is charged
// after it, spend nothing, or hold its estimate (req.Cost) as a
// reservation for the charge to settle.
func (c *Config) reserve(req *client.CheckRequest) {
	if req.Cost == nil {
		zero := int64(0)
		req.Cost = &zero
		return
	}
	var b [16]byte
	rand.Read(b[:])
	req.Reservation = hex.EncodeToString(b[:])
	req.ReservationTTLMS = c.ReservationTTL.Milliseconds()
}

// chargeAfter charges what the response in sw says the request cost. A
// reservation is settled only if the check recorded it: one decided by a
// fallback (the daemon, or its store, could not decide) did not, and the
// whole cost is charged. The charge outlives the request's context (the
// client may be gone, the cost was incurred) but not the Charger's own
// deadline; its errors go to OnError.
func (c *Config) chargeAfter(r *http.Request, req *client.CheckRequest, d *client.Decision, sw *statusWriter) {
	cost, ok, err := c.costOf(r, sw)
	if err != nil && c.OnError != nil {
		c.OnError(r, err)
	}
	if !ok {
		return
	}
	sw.Flush() // the body goes out before the charge's round trip
	in := client.ChargeRequest{SubjectFields: req.SubjectFields, Tier: req.Tier, Method: req.Method, Route: req.Route, Cost: &cost}
	if req.Reservation != "" && !d.Fallback && !d.Degraded {
		in.Reservation = req.Reservation
	}
	if _, err := c.charger().Charge(context.WithoutCancel(r.Context()), in); err != nil && c.OnError != nil {
		c.OnError(r, fmt.Errorf("charging %d after the response: %w", cost, err))
	}
}

// costOf is what the response says the request cost: Charge's answer, or
// ChargeHeader's value.
func (c *Config) costOf(r *http.Request, sw *statusWriter) (int64, bool, error) {
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if c.Charge != nil {
		n, ok := c.Charge(r, status, sw.Header())
		return n, ok, nil
	}
	v := strings.TrimSpace(sw.Header().Get(c.ChargeHeader))
	if v == "" {
		return 0, false, fmt.Errorf("httplimit: the response has no %s: nothing charged", c.ChargeHeader)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("httplimit: %s %q is not a cost: nothing charged", c.ChargeHeader, v)
	}
	return n, true, nil
}

// statusWriter records the status a handler answered with. It flushes
// (a streamed completion) and unwraps (http.ResponseController) to the
// writer it wraps.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush sends what the handler wrote so far, when the wrapped writer can.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap is the wrapped writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
