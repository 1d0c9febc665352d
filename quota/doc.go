// Package quota decides which limits apply to a request and on whose
// account: policies (versioned JSON documents with tiers, route globs,
// methods and cost tables), per-subject overrides, the API-key tier
// registry, the identity of a request (API key, user, client IP behind
// trusted proxies), the storage of all of that (FileStore) and the audit
// log of changes.
//
// A request flows through it as:
//
//	id, err := quota.Identify(req, cfg)        // or SubjectFields.Identity() for a JSON body
//	who := reg.Resolve(id)                     // subject and tier
//	route := quota.NormalizeRoute(path)        // one canonical spelling
//	applied := reg.Match(quota.Query{Tier: who.Tier, Subject: who.Subject, Method: m, Route: route})
//
// and each Applied carries the engine.Limit to check and the cost to spend.
// A policy the subject is exempt from (an Override with Unlimited) is not
// among them; MatchExempt also returns it, as an Exemption, for reporting.
// Quota knows nothing about how decisions are stored.
//
// Changes go through a Registry, which validates them as a whole, saves the
// new state to its Store, publishes it to readers atomically and appends an
// AuditEntry. Readers never lock.
//
// # Route globs
//
// A route glob is a path pattern that starts with '/'. It is split into
// segments at '/', and matched segment by segment against the request path
// (without its query string) in the canonical form of NormalizeRoute, in
// which the glob itself is compiled too ("/login/" is "/login"):
//
//   - a literal character matches itself (matching is case-sensitive);
//   - '*' inside a segment matches any run of characters except '/',
//     including none: "/v1/orders/*/items" matches "/v1/orders/7/items";
//   - a '*' that ends the pattern also matches any further segments, so
//     "/v1/*" matches "/v1/orders" and "/v1/orders/7" (but not "/v1"), and
//     "/v1/ord*" matches "/v1/orders/7";
//   - "**" is allowed only as the whole last segment and matches any number
//     of further segments, including none: "/v1/**" matches "/v1" and
//     "/v1/orders/7"; "/**" matches every path.
//
// Anything else is rejected when the policy is validated: a pattern that
// does not start with '/', empty segments ("//"), "**" elsewhere, '?', '[',
// ']', '{', '}', '\\', '#', spaces and control characters.
//
// # Tiers
//
// A request's tier is known in one of two ways, checked in this order:
//
//  1. A trusted gateway says so: IdentityConfig.TierHeader (e.g.
//     "X-Sluice-Tier") is read only when the direct peer is one of
//     IdentityConfig.TrustedProxies; in the check API the caller (the
//     gateway) puts it in the body's "tier". A client cannot pick its tier.
//  2. The key registry: the admin API registers an API key's tier
//     (Registry.PutKey); Registry.Resolve looks the request's key up.
//
// A request with neither is in TierAnonymous.
//
// # Subjects
//
// Limits are counted per subject: "key:<KeyID>" for an API key (a hash, so
// keys never reach stores, logs or the audit log), "user:<id>" for a user
// named by a trusted gateway, "ip:<IPv4>" per address or
// "ip6:<prefix>/64" per IPv6 /64, or a subject the check API caller names
// outright. Identify and SubjectFields.Identity produce the same subject for
// the same requester; Registry.Resolve counts a key that nobody vouches for
// (or a malformed one) by user or address instead, and with neither by the
// one shared UnknownKeySubject, so that invented keys do not multiply quota.
package quota
