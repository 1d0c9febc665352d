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
//	applied := reg.Match(quota.Query{Tier: who.Tier, Subject: who.Subject, Method: m, Route: path})
//
// and each Applied carries the engine.Limit to check and the cost to spend.
// Quota knows nothing about how decisions are stored.
//
// Changes go through a Registry, which validates them as a whole, saves the
// new state to its Store, publishes it to readers atomically and appends an
// AuditEntry. Readers never lock.
package quota
