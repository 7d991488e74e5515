package index

// SettlementReverses indexes settlements by the settlement they compensate.
const SettlementReverses = "spec.reverses"

// SettlementBillingProvider indexes BillingSettlements by
// spec.billingProviderRef: a deleting BillingProvider looks up the settlements that
// reference it without walking every settlement of the namespace.
const SettlementBillingProvider = "spec.billingProviderRef"

// EventChildren indexes WebhookEvents by the names of the children their facts
// derive, so a child's change is mapped to its events without listing them all.
const EventChildren = "spec.children"

// SettlementUID indexes BillingSettlements by UID: the archiver maps the settlements
// a ReconciliationReport confirms (by UID and version) to their names.
const SettlementUID = "metadata.uid"
