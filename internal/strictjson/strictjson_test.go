package strictjson

import "testing"

func TestDecode(t *testing.T) {
	type doc struct {
		N int    `json:"n"`
		S string `json:"s"`
	}
	tests := []struct {
		in          string
		field, want string
	}{
		{`{"n":1,"s":"x"}`, "", ""},
		{``, "", "empty document: want a JSON value"},
		{`{"n":1`, "", "truncated JSON"},
		{`{"n":"x"}`, "n", "want int, got JSON string"},
		{`{"m":1}`, "m", "unknown field"},
		{`{"n":1} {}`, "", "unexpected data after the JSON value"},
		{`{"n":1,}`, "", "malformed JSON at byte 8: invalid character '}' looking for beginning of object key string"},
	}
	for _, tt := range tests {
		var d doc
		err := Decode([]byte(tt.in), &d)
		if tt.want == "" {
			if err != nil {
				t.Errorf("Decode(%q) = %v, want nil", tt.in, err)
			}
			continue
		}
		if err == nil || err.Field != tt.field || err.Reason != tt.want {
			t.Errorf("Decode(%q) = %+v, want {%q %q}", tt.in, err, tt.field, tt.want)
		}
	}
}
