package quota

import (
	"errors"
	"slices"
	"testing"
)

func TestPolicyLease(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		size  int64  // LeaseSize when valid
		field string // the field a refusal names; "" when valid
	}{
		{"off by default", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000}`, 0, ""},
		{"on, slice of the burst", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{}}`, 5000, ""},
		{"on, max slice", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{"max_slice":500}}`, 500, ""},
		{"fixed window", `{"id":"p","algorithm":"fixed_window","limit":100,"window":1,"lease":{}}`, 0, "lease"},
		{"sliding counter", `{"id":"p","algorithm":"sliding_window_counter","limit":100,"window":1,"lease":{}}`, 0, "lease"},
		{"leaky bucket", `{"id":"p","algorithm":"leaky_bucket","rate_per_sec":100,"burst":100,"lease":{}}`, 0, "lease"},
		{"security", `{"id":"p","class":"security","algorithm":"token_bucket","rate_per_sec":100,"burst":100,"lease":{}}`, 0, "lease"},
		{"burst too small", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":500,"lease":{}}`, 0, "lease"},
		{"slice over the burst", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{"max_slice":6000}}`, 0, "lease.max_slice"},
		{"negative slice", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{"max_slice":-1}}`, 0, "lease.max_slice"},
		{"unknown lease field", `{"id":"p","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{"slice":1}}`, 0, "slice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(tt.doc))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("ParsePolicy = %v", err)
				}
				if got := p.LeaseSize(); got != tt.size {
					t.Errorf("LeaseSize() = %d, want %d", got, tt.size)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ParsePolicy = %v, want a *ValidationError naming %q", err, tt.field)
			}
			var fields []string
			for _, pr := range ve.Problems {
				fields = append(fields, pr.Field)
			}
			if !slices.Contains(fields, tt.field) {
				t.Errorf("ParsePolicy fields = %q, want %q among them (%v)", fields, tt.field, err)
			}
		})
	}
}
