// Package tenancy owns who a caller is: API keys as records (a name, the
// tenant it acts for, whether it is an admin key, its quotas, and only a
// digest of its secret), the Principal a request carries in its context
// from the API edge to the Manager, and the rule of who sees what.
//
// It authenticates and answers questions; it does not decide what an
// operation does, filter lists, or speak HTTP: the Manager checks
// ownership with Principal.Sees, and internal/server maps errors.
package tenancy
