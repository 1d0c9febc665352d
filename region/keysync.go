package region

import (
	"errors"
	"regexp"
	"slices"
	"strings"

	"github.com/sluice-rl/sluice/quota"
)

// keyIDPattern is the form of quota.KeyID: 128 bits in lower-case hex.
var keyIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// validKeys checks a received key registry as the admin API checks a
// registration: each entry's tier must be a valid tier, and its key id must
// be one quota.KeyID can produce (the admin API's check of the key itself,
// visible ASCII, cannot be made on a hash; a key id of another form could
// never match a request). A key id may be listed once. It returns the
// entries sorted by key id, or the index of the first invalid one and why;
// the error never quotes the entry, which may hold anything.
func validKeys(keys []quota.KeyEntry) ([]quota.KeyEntry, int, error) {
	out := make([]quota.KeyEntry, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		switch {
		case !keyIDPattern.MatchString(k.KeyID):
			return nil, i, errors.New("key_id must be 32 lower-case hex digits")
		case !tierPattern.MatchString(k.Tier):
			return nil, i, errors.New("tier must match ^[a-z0-9][a-z0-9._-]{0,63}$")
		case seen[k.KeyID]:
			return nil, i, errors.New("key_id listed twice")
		}
		seen[k.KeyID] = true
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b quota.KeyEntry) int { return strings.Compare(a.KeyID, b.KeyID) })
	return out, 0, nil
}
