package testenv

import "testing"

func TestCI(t *testing.T) {
	for _, c := range []struct {
		env  string
		want bool
	}{{"true", true}, {"", false}, {"1", false}, {"false", false}} {
		t.Setenv("CI", c.env)
		if got := CI(); got != c.want {
			t.Errorf("CI() with CI=%q = %v, want %v", c.env, got, c.want)
		}
	}
}

// TestTooSlowSkipsOutsideCI: outside CI a slow machine skips the test.
func TestTooSlowSkipsOutsideCI(t *testing.T) {
	t.Setenv("CI", "")
	ok := t.Run("slow", func(t *testing.T) {
		TooSlow(t, "offered %d", 1)
		t.Error("TooSlow returned")
	})
	if !ok {
		t.Error("TooSlow failed the test outside CI, want a skip")
	}
}
