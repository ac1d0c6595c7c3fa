// Package runc is the container driver: each sandbox is a runc container
// with its own PID, mount, UTS, IPC and network namespaces and a cgroup
// holding its CPU, memory and pids limits, whose init is the agent.
//
// The driver owns, for each sandbox, a directory <Root>/sandboxes/<id>
// (OCI bundle config.json, the agent's listening socket agent.sock, the
// agent's output agent.log, the init's pid file) and runc's state under
// <Root>/state. It never touches the sandbox's root file system beyond what
// runc does when it starts the container, and never deletes it.
//
// It does not persist sandbox records, schedule, or retry: the Manager does
// those, using List, Status and Delete to reconcile after a daemon restart.
// It does not run commands in the sandbox either; the agent does.
//
// `runc run --detach` is nearly the whole cost of Create (the agent is
// ready about when runc returns), so the create path runs runc exactly once
// and reads nothing back from it but the pid file. Delete runs runc twice
// (kill, then delete of the stopped container); Status runs it once; Stats
// only reads cgroup files.
package runc
