package region

import (
	"context"
	"net/http"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/internal/strictjson"
	"github.com/sluice-rl/sluice/quota"
)

// ChargeRequest is the body of POST /v1/charge (decide.ChargeRequest).
type ChargeRequest = decide.ChargeRequest

// charge is the core of POST /v1/charge: it charges a request's cost,
// after it was served, to the policies that apply to it, past their
// limits if need be (decide.Decider.Charge), and answers 200 with each
// policy's figures after the charge. Bad input is a 400 problem naming
// the field, and charges nothing.
func (d *Daemon) charge(ctx context.Context, w http.ResponseWriter, in *dataRequest) {
	var req ChargeRequest
	if p := decodeData(w, in, d.cfg.MaxBodyBytes, func(b []byte) *Problem { return decodeCharge(b, &req) }); p != nil {
		d.failData(w, in, p)
		return
	}
	ans, p := d.dec.Charge(ctx, req)
	if p != nil {
		d.failData(w, in, p)
		return
	}
	w.Header()["Cache-Control"] = hdrNoStore
	writeJSON(w, http.StatusOK, ans)
}

// decodeCharge decodes a charge's body strictly: one JSON object of known,
// exactly spelled members, each once.
func decodeCharge(body []byte, in *ChargeRequest) *Problem {
	var tmp ChargeRequest
	if e := strictjson.Decode(body, &tmp); e != nil {
		return invalid(e.Field, "%s", e.Reason)
	}
	*in = tmp
	return nil
}

// ChargeStates is the daemon's Decider().ChargeStates: it charges, after
// the fact, policies the caller matched.
func (d *Daemon) ChargeStates(ctx context.Context, subject string, applied []quota.Applied) (decide.ChargeAnswer, error) {
	return d.dec.ChargeStates(ctx, subject, applied)
}
