package deploy

import (
	"slices"
	"strings"
	"testing"
)

// With tls.enabled the daemon reads its certificate from the named
// kubernetes.io/tls Secret, mounted as a directory (so that a renewed
// Secret reaches it), refuses plaintext listeners, and is probed over
// HTTPS; tls.mutual chooses where client certificates are required, and
// "all" turns the probes, which cannot show one, into TCP checks.
func TestHelmTemplateTLS(t *testing.T) {
	known := serveFlags(t)
	for _, tc := range []struct {
		mutual    string
		wantFlags []string
		probe     string // readinessProbe's kind
	}{
		{"", []string{"--tls-cert-file=/etc/sluice/tls/tls.crt", "--tls-key-file=/etc/sluice/tls/tls.key", "--require-tls"}, "httpGet"},
		{"admin", []string{"--tls-cert-file=/etc/sluice/tls/tls.crt", "--tls-key-file=/etc/sluice/tls/tls.key", "--require-tls", "--admin-tls-client-ca-file=/etc/sluice/tls/ca.crt"}, "httpGet"},
		{"all", []string{"--tls-cert-file=/etc/sluice/tls/tls.crt", "--tls-key-file=/etc/sluice/tls/tls.key", "--require-tls", "--tls-client-ca-file=/etc/sluice/tls/ca.crt"}, "tcpSocket"},
	} {
		t.Run("mutual="+tc.mutual, func(t *testing.T) {
			objs := render(t, "--set", "tls.enabled=true", "--set", "tls.secretName=sluice-tls", "--set", "tls.mutual="+tc.mutual)
			pod := at(byKind(objs, "Deployment")[0], "spec", "template", "spec")
			c := at(pod, "containers", 0)
			var args []string
			for _, a := range at(c, "args").([]any) {
				args = append(args, a.(string))
			}
			for _, f := range tc.wantFlags {
				if !slices.Contains(args, f) {
					t.Errorf("args lack %s: %v", f, args)
				}
			}
			for _, a := range args[1:] {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if strings.Contains(name, "tls") && !known[name] {
					t.Errorf("argument %q is not a flag of sluice serve", a)
				}
			}
			if slices.Contains(args, "--tls-client-ca-file=/etc/sluice/tls/ca.crt") != (tc.mutual == "all") {
				t.Errorf("--tls-client-ca-file given = %v with mutual %q", !(tc.mutual == "all"), tc.mutual)
			}
			var mounted bool
			for _, m := range at(c, "volumeMounts").([]any) {
				if at(m, "name") == "tls" {
					mounted = at(m, "mountPath") == "/etc/sluice/tls" && at(m, "subPath") == nil
				}
			}
			if !mounted {
				t.Errorf("volume tls not mounted at /etc/sluice/tls as a directory: %v", at(c, "volumeMounts"))
			}
			var secret any
			for _, v := range at(pod, "volumes").([]any) {
				if at(v, "name") == "tls" {
					secret = at(v, "secret", "secretName")
				}
			}
			if secret != "sluice-tls" {
				t.Errorf("volume tls's Secret = %v, want sluice-tls", secret)
			}
			for _, p := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
				if at(c, p, tc.probe) == nil {
					t.Errorf("%s = %v, want %s", p, at(c, p), tc.probe)
				}
				if tc.probe == "httpGet" && at(c, p, "httpGet", "scheme") != "HTTPS" {
					t.Errorf("%s scheme = %v, want HTTPS", p, at(c, p, "httpGet", "scheme"))
				}
			}
		})
	}
	plain := at(byKind(render(t), "Deployment")[0], "spec", "template", "spec", "containers", 0)
	if got := at(plain, "readinessProbe", "httpGet", "scheme"); got != "HTTP" {
		t.Errorf("readinessProbe scheme without TLS = %v, want HTTP", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "tls.enabled=true"}, "tls.enabled needs tls.secretName"},
		{[]string{"--set", "tls.enabled=true", "--set", "tls.secretName=s", "--set", "tls.mutual=gateway"}, "/tls/mutual"},
	} {
		out, err := helm(t, append([]string{"template", "r", chart}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("helm template %v = %v, want a failure with %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}
