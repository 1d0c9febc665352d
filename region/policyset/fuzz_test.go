package policyset

import (
	"testing"
	"time"
)

// FuzzValidate feeds received bytes to what a receiver runs before it
// applies a set: Decode and Validate must not panic, and what Validate
// accepts must be overrides in force with distinct ids, key entries that
// quota accepts, distinct and sorted, and a set whose Diff against itself
// is empty.
func FuzzValidate(f *testing.F) {
	f.Add([]byte(`{"origin":"a1","policies":[{"id":"q","algorithm":"token_bucket","rate_per_sec":10,"burst":10,"mode":"enforce","scope":"region","class":"quota","on_store_failure":"open"}],` +
		`"overrides":[{"id":"vip","subject":"tenant-7","policy":"q","burst":50,"expires_at":"2031-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"origin":"old","policies":[]}`))
	f.Add([]byte(`{"overrides":[{"id":"x","subject":"s","policy":"p","limit":-1,"expires_at":"1999-01-01T00:00:00Z"}],"overrides":null}`))
	f.Add([]byte(`{"origin":"a1","policies":[],"keys":[{"key_id":"0123456789abcdef0123456789abcdef","tier":"pro"},` +
		`{"key_id":"00000000000000000000000000000000","tier":"free"}]}`))
	f.Add([]byte(`{"keys":[{"key_id":"sk-live-x","tier":"Pro"}],"keys":[]}`))
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Decode(data)
		if err != nil {
			return
		}
		got, err := set.Validate(now)
		if err != nil {
			return
		}
		if got.Overrides != nil {
			seen := map[string]bool{}
			for _, o := range *got.Overrides {
				if !o.ExpiresAt.After(now) || seen[o.ID] {
					t.Fatalf("Validate accepted %+v (expired or repeated)", o)
				}
				seen[o.ID] = true
			}
		}
		if got.Keys != nil {
			for i, k := range *got.Keys {
				if k.Validate() != nil || (i > 0 && (*got.Keys)[i-1].KeyID >= k.KeyID) {
					t.Fatalf("Validate accepted keys %+v (malformed, repeated or out of order)", *got.Keys)
				}
			}
		}
		if c := Diff(got, got); !c.Empty() {
			t.Fatalf("Diff of a set with itself = %+v, want nothing", c)
		}
		if got.Hash() != set.Hash() && got.Overrides == nil {
			t.Fatalf("Validate changed the hash of a set without overrides")
		}
	})
}
