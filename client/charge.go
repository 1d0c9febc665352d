package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sluice-rl/sluice/decide"
)

// ChargeRequest is the body of POST /v1/charge: the requester and the
// request as in a CheckRequest, what it cost once served and, optionally,
// the reservation of a check of its estimate to settle
// (decide.ChargeRequest).
type ChargeRequest = decide.ChargeRequest

// ChargeAnswer is a charge's answer: each charged policy's figures after
// the charge, and whether the subject is now past a limit
// (decide.ChargeAnswer).
type ChargeAnswer = decide.ChargeAnswer

// Charge charges req's cost after the fact to the policies that apply to
// it, past their limits if need be. Bad input (a missing or negative cost,
// an unknown or expired reservation, a request no policy applies to) is a
// *Problem naming the field, and charges nothing. A daemon that cannot be
// asked is an error wrapping ErrUnavailable, whatever the FailureMode: a
// charge has no decision to fall back to. The charge is sent once.
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (*ChargeAnswer, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("charge: %w", err)
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/charge", nil, body, false)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, c.problemOf("POST", "/v1/charge", r)
	}
	var ans ChargeAnswer
	if err := json.Unmarshal(r.body, &ans); err != nil {
		return nil, &unavailableError{c.base.Host, fmt.Errorf("POST /v1/charge: the answer is not a charge: %w", err)}
	}
	return &ans, nil
}
