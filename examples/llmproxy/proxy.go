package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/client/httplimit"
	"github.com/sluice-rl/sluice/quota"
)

// tokensHeader is the response header the proxy reports a completion's
// tokens in, and the middleware charges them from.
const tokensHeader = "X-Sluice-Tokens"

// maxCompletion bounds what the proxy reads of a completion to find its
// usage.
const maxCompletion = 16 << 20

// policies are the proxy's limits, per API key: tokens per minute and per
// day, UTC-aligned fixed windows, charged after each completion with what
// it used.
func policies(perMinute, perDay float64) []quota.Policy {
	return []quota.Policy{
		{ID: "llm-tokens-minute", Algorithm: "fixed_window", Count: perMinute, Window: 60, Mode: quota.ModeEnforce},
		{ID: "llm-tokens-day", Algorithm: "fixed_window", Count: perDay, Window: 86400, Mode: quota.ModeEnforce},
	}
}

// newProxy forwards every request to backend, limited by checker (which
// must also charge: *client.Client or *local.Limiter). A request is
// refused (429) while its API key is past either budget; each completion
// the backend answers is charged its usage.total_tokens after the fact.
func newProxy(backend *url.URL, checker httplimit.Checker, onError func(*http.Request, error)) (http.Handler, error) {
	rp := httputil.NewSingleHostReverseProxy(backend)
	rp.ModifyResponse = reportTokens
	mw, err := httplimit.New(httplimit.Config{
		Checker:      checker,
		Subject:      apiKey,
		ChargeHeader: tokensHeader,
		OnError:      onError,
	})
	if err != nil {
		return nil, err
	}
	return mw(rp), nil
}

// apiKey counts a request by the bearer token it sends.
func apiKey(r *http.Request) (quota.SubjectFields, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" || len(key) > 256 {
		return quota.SubjectFields{}, errors.New("Authorization: a bearer API key is required")
	}
	return quota.SubjectFields{Subject: "apikey:" + key}, nil
}

// reportTokens reads a completion's usage.total_tokens into tokensHeader
// and hands the body on unchanged. An answer without usage (an error of
// the backend) reports 0.
func reportTokens(res *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(res.Body, maxCompletion))
	res.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the completion: %w", err)
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	var c struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(body, &c)
	res.Header.Set(tokensHeader, strconv.FormatInt(max(c.Usage.TotalTokens, 0), 10))
	return nil
}
