// Package jobcompletion is the JobCompletion reconciler: it applies a job's latest
// proposed completion version to the job sink, once, with retries and backoff.
package jobcompletion
