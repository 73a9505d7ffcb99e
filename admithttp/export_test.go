package admithttp

// The draft's names, for the tests' expected fields and grammar checks, so
// that a revision that renames a parameter is one edit in fields.go.
const (
	PolicyField    = policyField
	LimitField     = limitField
	QuotaParam     = quotaParam
	UnitParam      = unitParam
	WindowParam    = windowParam
	RemainingParam = remainingParam
	ResetParam     = resetParam
)
