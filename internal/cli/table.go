package cli

import (
	"fmt"
	"io"
	"strings"
)

// command is one row of the CLI's command table: its name, the help lines
// `corral help` shows for it under its group, what runs it, and what shell
// completion offers for its arguments.
type command struct {
	name  string
	group string // one of helpGroups; "" keeps the command out of the help
	usage []usageLine
	run   func(c *cli, args []string) int
	// complete offers the completions of the argument after args (see
	// completion.go); nil offers nothing.
	complete completer
}

// usageLine is one entry of the help: a synopsis and its explanation,
// whose further lines ("\n") are indented under the first.
type usageLine struct{ synopsis, text string }

// Help groups, in the order the help shows them.
const (
	groupSandboxes = "Sandboxes:"
	groupSnapshots = `Snapshots (runtimes say what they hold: "corral doctor" or GET /v1/runtimes):`
	groupProcesses = "Processes:"
	groupFiles     = "Files:"
	groupVolumes   = "Volumes (outlive sandboxes; several sandboxes may mount one):"
	groupTemplates = "Templates:"
	groupPools     = "Warm pools (creates of a pool's shape, or with --pool NAME, take a ready sandbox):"
	groupDaemon    = "Daemon:"
	groupShell     = "Shell:"
)

var helpGroups = []string{groupSandboxes, groupSnapshots, groupProcesses, groupFiles, groupVolumes, groupTemplates, groupPools, groupDaemon, groupShell}

// commands is the command table, in the order the help lists each group's
// commands.
func commands() []command {
	return []command{
		{name: "run", group: groupSandboxes, run: (*cli).run, usage: []usageLine{
			{"run [flags] -- CMD...", "create a sandbox, run CMD, print its output, destroy it"}}},
		{name: "create", group: groupSandboxes, run: (*cli).create, usage: []usageLine{
			{"create [flags]", "create a sandbox and print its ID"},
			{"run|create -v SRC:DST[:MODE]", "mount host directory SRC at DST, as docker -v: MODE ro,\n" +
				"rw (default) or cow (writes stay in the sandbox); SRC is\n" +
				"absolute or ./relative, beneath a directory the daemon\n" +
				"allows (server --allow-mount DIR); a bare name is a volume"}}},
		{name: "exec", group: groupSandboxes, run: (*cli).exec, complete: firstSandbox, usage: []usageLine{
			{"exec [flags] ID -- CMD...", "run CMD in a sandbox; exits with its status\n(-d: start it in the background and print its PID)"}}},
		{name: "code", group: groupSandboxes, run: (*cli).code, complete: firstSandbox, usage: []usageLine{
			{"code [flags] ID [-- CODE...]", "run code in a code-interpreter sandbox (or -f FILE, or stdin;\n" +
				"--language python|javascript|bash, --context CTX); variables\n" +
				"stay between runs; image results are saved as files"},
			{"code contexts ID [--create LANG | --restart CTX | --rm CTX]", "list or manage its contexts"}}},
		{name: "shell", group: groupSandboxes, run: (*cli).shell, complete: firstSandbox, usage: []usageLine{
			{"shell [flags] ID [-- CMD...]", "interactive terminal (default: the user's login shell);\nexits with the remote status"}}},
		{name: "ls", group: groupSandboxes, run: (*cli).ls, complete: noArgs, usage: []usageLine{
			{"ls [--state S] [-q]", "list sandboxes"}}},
		{name: "inspect", group: groupSandboxes, run: (*cli).inspect, complete: firstSandbox, usage: []usageLine{
			{"inspect ID", "show a sandbox as JSON"}}},
		{name: "diff", group: groupSandboxes, run: (*cli).diff, complete: firstSandbox, usage: []usageLine{
			{"diff [--json] ID DST", "list what a sandbox changed under its cow mount at DST\n(A added, M modified, D deleted); the host directory is unchanged"}}},
		{name: "timeout", group: groupSandboxes, run: (*cli).timeout, complete: firstSandbox, usage: []usageLine{
			{"timeout ID DURATION", "set a sandbox's deadline to now+DURATION (0: none)"}}},
		{name: "update", group: groupSandboxes, run: (*cli).update, complete: firstSandbox, usage: []usageLine{
			{"update ID [--cpus N] [--memory M] [--pids N]", "change a running sandbox's limits"},
			{"update ID [--idle-timeout D] [--on-idle A] [--on-deadline A]", "change its idle timeout and timer actions (destroy|pause|stop)"}}},
		{name: "network", group: groupSandboxes, run: (*cli).network, complete: firstSandbox, usage: []usageLine{
			{"network ID [--mode M] [--allow-domain D]... [--allow-cidr C]...", "show a sandbox's network policy, or replace it live"},
			{"run|create|network ... --inject-header DOMAIN:HEADER=TEMPLATE", "the proxy sets HEADER on requests to DOMAIN; TEMPLATE names\n" +
				"secrets as {{secret:NAME}} (corral secret), which never\n" +
				"enter the sandbox (network keeps the header rules it does\n" +
				"not name)"}}},
		{name: "port", group: groupSandboxes, run: (*cli).port, complete: firstSandbox, usage: []usageLine{
			{"port ID PORT", "print the URL at which the daemon forwards HTTP and\nWebSockets to PORT of a sandbox (API key required on TCP)"}}},
		{name: "stop", group: groupSandboxes, run: (*cli).stop, complete: sandboxes, usage: []usageLine{
			{"stop ID...", "end every process of sandboxes and free their memory and CPU;\ntheir files, settings and IDs stay for a start"}}},
		{name: "start", group: groupSandboxes, run: (*cli).start, complete: sandboxes, usage: []usageLine{
			{"start [--timeout D] ID...", "boot stopped sandboxes again on their files; the deadline\nbecomes now+D (default: the daemon's)"}}},
		{name: "rm", group: groupSandboxes, run: (*cli).rm, complete: sandboxes, usage: []usageLine{
			{"rm ID...", "destroy sandboxes"}}},
		{name: "events", group: groupSandboxes, run: (*cli).events, complete: noArgs, usage: []usageLine{
			{"events [--sandbox ID] [--type T]... [--json]", "follow lifecycle events (created, running, deleted, ...)"}}},

		{name: "pause", group: groupSnapshots, run: (*cli).pause, complete: sandboxes, usage: []usageLine{
			{"pause ID...", "freeze every process of sandboxes"}}},
		{name: "resume", group: groupSnapshots, run: (*cli).resume, complete: firstSandbox, usage: []usageLine{
			{"resume [--timeout D] ID", "thaw a sandbox; its deadline becomes now+D (default: the daemon's)"}}},
		{name: "snapshot", group: groupSnapshots, run: (*cli).snapshot, complete: subcommands("create", "ls", "rm", "template"), usage: []usageLine{
			{"snapshot create [--metadata K=V]... [--volumes share|copy] ID NAME", "save a sandbox: files (runc), or files, memory and processes (gVisor);\n" +
				"its volumes are shared, or copied as VOLUME-NAME"},
			{"snapshot ls | rm NAME...", "list or delete snapshots"},
			{"snapshot template SNAPSHOT TEMPLATE", "make a template of a snapshot's files"},
			{"create --from-snapshot NAME", "start a sandbox from a snapshot"}}},
		{name: "fork", group: groupSnapshots, run: (*cli).fork, complete: firstSandbox, usage: []usageLine{
			{"fork [--count N] [--volumes share|copy] ID", "copy a sandbox N times (gVisor: the processes go on in each copy);\n" +
				"its volumes are shared, or copied as VOLUME-<copy's ID>"}}},

		{name: "ps", group: groupProcesses, run: (*cli).ps, complete: firstSandbox, usage: []usageLine{
			{"ps ID", "list processes (running, and exited ones kept)"}}},
		{name: "logs", group: groupProcesses, run: (*cli).logs, complete: firstSandbox, usage: []usageLine{
			{"logs [-f] [--from N] ID PID", "print a process's output (replay, then follow with -f)"}}},
		{name: "attach", group: groupProcesses, run: (*cli).attach, complete: firstSandbox, usage: []usageLine{
			{"attach [-i] ID PID", "connect to a process (PTY: Ctrl-] detaches; the process keeps running)"}}},
		{name: "kill", group: groupProcesses, run: (*cli).kill, complete: firstSandbox, usage: []usageLine{
			{"kill [-s SIG] ID PID", "signal a process (default SIGKILL)"}}},

		{name: "cp", group: groupFiles, run: (*cli).cp, complete: files, usage: []usageLine{
			{"cp SRC DST", "copy between the host and a sandbox; one side is ID:/path.\n" +
				"Like docker cp: a file onto an existing directory goes\n" +
				"inside it; a directory onto an existing directory goes\n" +
				"inside it as DIR/<name> (SRC ending in /. copies only its\n" +
				"contents); a directory onto a missing path creates it."}}},

		{name: "volume", group: groupVolumes, run: (*cli).volume, complete: subcommands("create", "ls", "inspect", "rm"), usage: []usageLine{
			{"volume create NAME [--size 10G] [--label K=V]...", "make an empty volume (--size: btrfs storage only)"},
			{"volume ls [--json] | inspect NAME | rm NAME...", "list, show or delete volumes (rm refuses one in use)"},
			{"run|create -v NAME:DST[:MODE]", "mount volume NAME at DST (ro, rw or cow)"}}},

		{name: "template", group: groupTemplates, run: (*cli).template, complete: templateArgs, usage: []usageLine{
			{"template ls", "list templates"},
			{"template pull NAME REF [--platform P] [--insecure]", "make a template from a registry image (its Env, WorkingDir\n" +
				"and User become the defaults of execs in its sandboxes)"},
			{"template import NAME FILE", "from a root file system tarball, an OCI image layout tar\nor a docker save archive"},
			{"template build NAME [--recipe debian|code-interpreter|busybox]", ""},
			{"template build NAME -f Dockerfile [CONTEXT] [--build-arg K=V]...", "build a Dockerfile (FROM, RUN, COPY, ADD, ENV, WORKDIR,\n" +
				"USER, ARG, ...); RUN steps run in sandboxes, without\n" +
				"network unless --network or --allow-domain say otherwise;\n" +
				"unchanged steps come from the cache"},
			{"template build|pull ... [--start CMD] [--ready CMD | --ready-port N | --ready-url URL]\n" +
				"         [--ready-timeout DUR] [--restart POLICY] [--no-start]", "give the template a service: started in every new sandbox,\n" +
				"which is running once it is ready; a Dockerfile's own\n" +
				"CMD/ENTRYPOINT is the start command unless --no-start"},
			{"template service NAME [--start CMD ...] | --clear", "show, replace or remove a template's service"},
			{"template inspect NAME", "show a template as JSON"},
			{"template capture NAME [--runtime R] [--drop]", "save a new sandbox of the template, its service ready, with its\nmemory (gVisor); its sandboxes then start from that state"},
			{"template rm NAME...", "delete templates"}}},

		{name: "pool", group: groupPools, run: (*cli).pool, complete: subcommands("set", "ls", "rm"), usage: []usageLine{
			{"pool set NAME --template T [--runtime R] [--cpus N] [--memory M] [--pids N]\n" +
				"         [--disk D] [--network MODE] --size N", "define or change a pool"},
			{"pool ls", "list pools with their ready sandboxes"},
			{"pool rm NAME...", "delete pools and their unclaimed sandboxes"}}},

		{name: "key", group: groupDaemon, run: (*cli).key, complete: subcommands("create", "ls", "rm", "rotate"), usage: []usageLine{
			{"key create NAME [--tenant T] [--admin] [--max-sandboxes N]", "make an API key for a tenant; its secret is printed once\n" +
				"(--max-memory, --max-cpus, --max-disk, --creates-per-minute:\n" +
				"the tenant's quotas)"},
			{"key ls [--json] | rm NAME... | rotate NAME", "list, revoke or re-issue keys (admin keys only)"}}},
		{name: "secret", group: groupDaemon, run: (*cli).secret, complete: subcommands("create", "rotate", "ls", "rm"), usage: []usageLine{
			{"secret create|rotate NAME < FILE", "store or replace a secret of your tenant; the value is read\n" +
				"from standard input (not echoed on a terminal) and never\n" +
				"shown again; policies name it as {{secret:NAME}}"},
			{"secret ls [--json] | rm NAME...", "list (names and times, never values) or delete secrets"}}},
		{name: "mcp", group: groupDaemon, run: (*cli).mcpServe, complete: noArgs, usage: []usageLine{
			{"mcp [--template T] [--allow-runtime R]... [--max-sandboxes N] [--network M]", "serve the tools of the Model Context Protocol on stdin/stdout\n" +
				"for an agent (Claude Desktop, Claude Code, Cursor); docs/MCP.md"}}},
		{name: "server", group: groupDaemon, run: (*cli).server, complete: noArgs, usage: []usageLine{
			{"server [flags]", "run the daemon"},
			{"server --cluster-etcd ENDPOINTS --node-name NAME --advertise HOST:PORT", "run it as a node of a cluster, registered in etcd; docs/CLUSTER.md"}}},
		{name: "node", group: groupDaemon, run: (*cli).node, complete: subcommands("ls"), usage: []usageLine{
			{"node ls [--json]", "list the cluster's live nodes, their capacity and load\n(admin keys only)"}}},
		{name: "audit", group: groupDaemon, run: (*cli).audit, complete: auditArgs, usage: []usageLine{
			{"audit [--sandbox ID] [--key NAME] [--since T] [--follow] [--json]", "print the audit log: every mutating API call and every command\n" +
				"started in a sandbox, with its key; T is a time (RFC 3339) or\n" +
				"a duration ago (10m, 2h)"}}},
		{name: "version", group: groupDaemon, run: (*cli).version, complete: noArgs, usage: []usageLine{
			{"version", ""}}},
		{name: "doctor", group: groupDaemon, run: (*cli).doctor, complete: noArgs, usage: []usageLine{
			{"doctor [--json]", "which runtimes and storage work on this host, and fixes"}}},
		{name: "bench", group: groupDaemon, run: (*cli).bench, complete: noArgs, usage: []usageLine{
			{"bench [--runtime R] [--iterations N] [--burst B] [--density D] [--peers] [--json]",
				"measure latency, burst, density (and peers) against the daemon"}}},

		{name: "completion", group: groupShell, run: (*cli).completion, complete: subcommands(completionShells...), usage: []usageLine{
			{"completion bash|zsh|fish", "print a completion script: source <(corral completion bash)"}}},

		// The agent is dispatched before the table is built (see Main);
		// its row lets completion and the unknown-command check know it.
		{name: "agent", run: (*cli).agent, complete: noArgs},
	}
}

// synopsisWidth is the column at which the help's explanations start,
// after a two-space indent.
const synopsisWidth = 28

// writeUsage prints the help generated from the command table.
func writeUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: corral COMMAND [flags]\n")
	table := commands()
	for _, g := range helpGroups {
		b.WriteString("\n" + g + "\n")
		for _, cmd := range table {
			if cmd.group != g {
				continue
			}
			for _, u := range cmd.usage {
				writeUsageLine(&b, u)
			}
		}
	}
	b.WriteString(`
Clients find the daemon through CORRAL_HOST (default unix:///run/corral/corral.sock,
or http://host:port) and CORRAL_API_KEY.
`)
	fmt.Fprint(w, b.String())
}

// writeUsageLine puts a synopsis that fits in synopsisWidth and the first
// line of its text on one line, and every other line of either below it.
func writeUsageLine(b *strings.Builder, u usageLine) {
	syn := strings.Split(u.synopsis, "\n")
	var text []string
	if u.text != "" {
		text = strings.Split(u.text, "\n")
	}
	last := syn[len(syn)-1]
	for _, s := range syn[:len(syn)-1] {
		b.WriteString("  " + s + "\n")
	}
	if len(text) > 0 && len(last) <= synopsisWidth {
		fmt.Fprintf(b, "  %-*s %s\n", synopsisWidth, last, text[0])
		text = text[1:]
	} else {
		b.WriteString("  " + last + "\n")
	}
	for _, t := range text {
		fmt.Fprintf(b, "  %*s %s\n", synopsisWidth, "", t)
	}
}

func (c *cli) server(args []string) int { return c.serverMain(args) }
func (c *cli) agent(args []string) int  { return c.agentMain(args) }

func (c *cli) version(args []string) int {
	fmt.Fprintln(c.env.Stdout, "corral", Version)
	return 0
}
