// Package settlement is the money decision, pure and table-tested: could money have
// moved under a settlement's key (exposure), what happens next (Decide: submit, look
// up, poll, wait, adopt, dead-letter, hold, release), the retry policy and budget,
// backoff, whether a settlement's name and keys are the ones derived from its
// settlement key, whether a provider's record is provably the settlement, and the
// rules a compensation must pass (never more than was charged; a Void only alone).
//
// It imports no client-go and no controller-runtime: everything it decides on is
// passed in, so 'can this be sent twice?' is answered by reading this package and its
// tests (docs/design.md §11). The settlement reconciler only carries its decisions out.
package settlement
