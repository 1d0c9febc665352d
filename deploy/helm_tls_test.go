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

// The store over TLS: redisTLS.secretName mounts the Secret as a directory
// (so that renewed files reach the pod, where the daemon re-reads them)
// and passes its ca.crt, tls.crt and tls.key as the --redis-tls-* flags,
// each of which can be left out; redisTLS.serverName and the Sentinels'
// credentials map onto their flags, the password from a Secret key through
// the environment, never in the arguments. Each value beside a store that
// cannot use it fails the render.
func TestHelmTemplateRedisTLS(t *testing.T) {
	known := serveFlags(t)
	const (
		ca   = "--redis-tls-ca=/etc/sluice/redis-tls/ca.crt"
		cert = "--redis-tls-cert=/etc/sluice/redis-tls/tls.crt"
		key  = "--redis-tls-key=/etc/sluice/redis-tls/tls.key"
	)
	for _, tc := range []struct {
		name      string
		args      []string
		want, not []string // flags present, and absent
		mounted   bool
		password  bool // SLUICE_REDIS_SENTINEL_PASSWORD from the Secret
	}{
		{"plaintext store", nil, nil, []string{ca, cert, key}, false, false},
		{"CA and client certificate", []string{"store=rediss://redis:6380", "redisTLS.secretName=redis-tls"}, []string{ca, cert, key}, nil, true, false},
		{"CA only", []string{"store=rediss-cluster://a:6380\\,b:6380", "redisTLS.secretName=redis-tls", "redisTLS.clientCertificate=false"}, []string{ca}, []string{cert, key}, true, false},
		{"client certificate and the system's CAs", []string{"store=rediss://redis:6380", "redisTLS.secretName=redis-tls", "redisTLS.ca=false"}, []string{cert, key}, []string{ca}, true, false},
		{"server name alone", []string{"store=rediss://redis:6380", "redisTLS.serverName=redis.internal"}, []string{"--redis-tls-server-name=redis.internal"}, []string{ca, cert}, false, false},
		{"Sentinel over TLS with its credentials", []string{"store=rediss-sentinel://mymaster@s1:26380\\,s2:26380", "redisTLS.secretName=redis-tls",
			"redisTLS.serverName=redis.internal", "redisSentinel.username=sentinel-user", "redisSentinel.passwordSecret.name=sentinel-auth"},
			[]string{ca, cert, key, "--redis-tls-server-name=redis.internal", "--redis-sentinel-username=sentinel-user"}, nil, true, true},
		{"Sentinel password alone", []string{"store=redis-sentinel://mymaster@s1:26379", "redisSentinel.passwordSecret.name=sentinel-auth"}, nil, []string{ca}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, a := range tc.args {
				args = append(args, "--set", a)
			}
			pod := at(byKind(render(t, args...), "Deployment")[0], "spec", "template", "spec")
			c := at(pod, "containers", 0)
			var flags []string
			for _, a := range at(c, "args").([]any) {
				flags = append(flags, a.(string))
			}
			for _, f := range tc.want {
				if !slices.Contains(flags, f) {
					t.Errorf("args lack %s: %v", f, flags)
				}
			}
			for _, f := range tc.not {
				if slices.Contains(flags, f) {
					t.Errorf("args have %s: %v", f, flags)
				}
			}
			for _, a := range flags[1:] {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if strings.HasPrefix(name, "redis-") && !known[name] {
					t.Errorf("argument %q is not a flag of sluice serve", a)
				}
				if strings.HasPrefix(name, "redis-sentinel-password") {
					t.Errorf("the Sentinel password is in the arguments: %q", a)
				}
			}
			var mounted bool
			for _, m := range at(c, "volumeMounts").([]any) {
				if at(m, "name") == "redis-tls" {
					mounted = at(m, "mountPath") == "/etc/sluice/redis-tls" && at(m, "subPath") == nil
				}
			}
			if mounted != tc.mounted {
				t.Errorf("redis-tls mounted at /etc/sluice/redis-tls as a directory = %v, want %v: %v", mounted, tc.mounted, at(c, "volumeMounts"))
			}
			var secret any
			for _, v := range at(pod, "volumes").([]any) {
				if at(v, "name") == "redis-tls" {
					secret = at(v, "secret", "secretName")
				}
			}
			if tc.mounted && secret != "redis-tls" {
				t.Errorf("volume redis-tls's Secret = %v, want redis-tls", secret)
			}
			var ref any
			for _, e := range at(c, "env").([]any) {
				if at(e, "name") == "SLUICE_REDIS_SENTINEL_PASSWORD" {
					ref = at(e, "valueFrom", "secretKeyRef")
				}
			}
			switch {
			case tc.password && (at(ref, "name") != "sentinel-auth" || at(ref, "key") != "password"):
				t.Errorf("SLUICE_REDIS_SENTINEL_PASSWORD from %v, want the key password of Secret sentinel-auth", ref)
			case !tc.password && ref != nil:
				t.Errorf("SLUICE_REDIS_SENTINEL_PASSWORD set from %v without redisSentinel.passwordSecret", ref)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "redisTLS.secretName=s"}, "redisTLS.secretName needs a TLS store"},
		{[]string{"--set", "redisTLS.serverName=redis.internal"}, "redisTLS.serverName needs a TLS store"},
		{[]string{"--set", "store=rediss://redis:6380", "--set", "redisSentinel.username=u", "--set", "redisSentinel.passwordSecret.name=s"}, "redisSentinel needs a Sentinel store"},
		{[]string{"--set", "store=redis-sentinel://m@s:26379", "--set", "redisSentinel.username=u"}, "redisSentinel.username needs redisSentinel.passwordSecret.name"},
		{[]string{"--set", "redisTLS.certificate=true"}, "redisTLS"},
	} {
		out, err := helm(t, append([]string{"template", "r", chart}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("helm template %v = %v, want a failure with %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}
