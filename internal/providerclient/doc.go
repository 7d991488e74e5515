// Package providerclient builds and caches the billing client of each BillingProvider
// (by UID, generation and token fingerprint), records how its calls went (the health
// both the settlement and the billing-provider reconcilers report), and says where a
// provider points (its target), which a settlement records before every call.
package providerclient
