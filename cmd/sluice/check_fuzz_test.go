package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadPolicyDocs: an apply file of any bytes is documents or an
// error, never a panic, and every document read has an id.
func FuzzReadPolicyDocs(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":2}`,
		`[{"id":"a","algorithm":"fixed_window","limit":10,"window":60},{"id":"b","algorithm":"token_bucket","rate_per_sec":1,"burst":2}]`,
		`{"id":""}`, `[]`, `[`, `{`, ``, `null`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, viaStdin := range []bool{false, true} {
			var docs []policyDoc
			var err error
			if viaStdin {
				docs, err = readPolicyDocs("-", bytes.NewReader(data))
			} else {
				p := filepath.Join(dir, "doc.json")
				if werr := os.WriteFile(p, data, 0o600); werr != nil {
					t.Fatal(werr)
				}
				docs, err = readPolicyDocs(p, nil)
			}
			if err == nil && len(docs) == 0 {
				t.Fatalf("readPolicyDocs(%q) = no documents and no error", data)
			}
			for _, d := range docs {
				if d.id == "" || len(d.raw) == 0 {
					t.Fatalf("readPolicyDocs(%q) read a document without id or bytes: %+v", data, d)
				}
			}
		}
	})
}
