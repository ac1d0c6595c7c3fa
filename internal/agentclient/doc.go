// Package agentclient is the daemon-side client of the in-sandbox agent
// (package agentserver). It speaks the agent protocol over connections that a
// driver dials and turns wire errors back into errdefs kinds. It holds no
// sandbox state of its own.
package agentclient
