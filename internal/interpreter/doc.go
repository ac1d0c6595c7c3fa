// Package interpreter is the code interpreter service that runs inside a
// sandbox of the code-interpreter template (`corral-agent interpreter`,
// its start command): stateful contexts, each one long-lived kernel with
// its own variables and working directory, and the HTTP API of E2B's code
// interpreter on port 49999 (/health, /execute, /contexts), which
// @e2b/code-interpreter and the daemon's own clients speak.
//
// A Python context is an IPython kernel (ipykernel) spoken to with the
// Jupyter messaging protocol over a small ZMTP client of its own
// (zmtp.go); its rich results (HTML, images, LaTeX, JSON, data frames as
// data, matplotlib figures as E2B's chart structure) are Jupyter's MIME
// bundles. JavaScript and bash contexts are a Node.js process running
// kernel.js and a bash process, whose output is their own stdout and
// stderr. Executions on one context run one at a time, in order; a
// deadline or a client that goes away interrupts the kernel (SIGINT), and
// a kernel that does not stop, or that dies, leaves the context with an
// error until it is restarted.
//
// It does not know about sandboxes, the daemon or tenants: whatever can
// reach its port may use it, and the sandbox's isolation is what bounds
// that. Its goroutines are owned by the Server (Close stops the kernels,
// and with them their readers) and by the requests in progress.
package interpreter
