package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	corral "github.com/corralrun/corral/sdk"
)

// imageFormats are the result representations `corral code` saves as
// files, with their extensions, most wanted first.
var imageFormats = []struct {
	ext    string
	get    func(corral.Result) string
	base64 bool
}{
	{"png", func(r corral.Result) string { return r.PNG }, true},
	{"jpeg", func(r corral.Result) string { return r.JPEG }, true},
	{"svg", func(r corral.Result) string { return r.SVG }, false},
	{"pdf", func(r corral.Result) string { return r.PDF }, true},
}

// code runs code in a sandbox's code interpreter: `corral code ID --
// 'print(1)'`, or the code from -f FILE or stdin. Output streams as it
// comes; each result prints as text, an image result is saved to a file
// whose name is printed, and an exception prints its traceback to stderr
// and makes the exit status 1.
func (c *cli) code(args []string) int {
	fs := c.flags("code")
	lang := fs.String("language", "", "python (default), javascript or bash: run on that language's default context")
	ctxID := fs.String("context", "", "run on this context (see code contexts)")
	file := fs.String("f", "", "read the code from this file (- for stdin)")
	dir := fs.String("save", ".", "directory to save image results in")
	timeout := fs.Duration("timeout", 0, "interrupt the execution after this long (the context stays)")
	asJSON := fs.Bool("json", false, "print the whole execution as JSON at the end instead")
	var env multiFlag
	fs.Var(&env, "env", "KEY=VALUE for this execution (repeatable)")
	before, codeArgs := splitCommand(args)
	if err := fs.Parse(before); err != nil {
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) >= 1 && rest[0] == "contexts" {
		return c.codeContexts(rest[1:])
	}
	usage := "usage: corral code [flags] ID [-- CODE...] (or -f FILE, or the code on stdin)"
	if len(rest) != 1 {
		fmt.Fprintln(c.env.Stderr, usage)
		return exitUsage
	}
	id := rest[0]
	var src string
	switch {
	case len(codeArgs) > 0 && *file != "":
		fmt.Fprintln(c.env.Stderr, "corral code: give the code after -- or with -f, not both")
		return exitUsage
	case len(codeArgs) > 0:
		src = strings.Join(codeArgs, " ")
	default:
		var r io.Reader = c.env.Stdin
		if *file != "" && *file != "-" {
			f, err := os.Open(*file)
			if err != nil {
				return c.fail(err)
			}
			defer f.Close()
			r = f
		}
		b, err := io.ReadAll(r)
		if err != nil {
			return c.fail(err)
		}
		src = string(b)
	}
	envMap, err := env.pairs("--env")
	if err != nil {
		fmt.Fprintln(c.env.Stderr, "corral code:", err)
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	saved := 0
	opts := corral.CodeOptions{Context: *ctxID, Language: *lang, Env: envMap, Timeout: *timeout}
	if !*asJSON {
		opts.OnStdout = func(s string) { io.WriteString(c.env.Stdout, s) }
		opts.OnStderr = func(s string) { io.WriteString(c.env.Stderr, s) }
		opts.OnResult = func(r corral.Result) {
			if name, ok, err := saveImage(*dir, id, &saved, r); err != nil {
				fmt.Fprintf(c.env.Stderr, "corral code: saving an image result: %v\n", err)
			} else if ok {
				fmt.Fprintf(c.env.Stdout, "[image saved to %s]\n", name)
				return
			}
			if r.Text != "" {
				fmt.Fprintln(c.env.Stdout, r.Text)
			}
		}
		opts.OnError = func(e corral.ExecutionError) { fmt.Fprintln(c.env.Stderr, e.Traceback) }
	}
	x, err := client.RunCode(ctx, id, src, opts)
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		enc := json.NewEncoder(c.env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(x); err != nil {
			return c.fail(err)
		}
	}
	if x.TimedOut {
		fmt.Fprintf(c.env.Stderr, "corral code: interrupted after %s\n", *timeout)
	}
	if x.Error != nil || x.TimedOut {
		return 1
	}
	return 0
}

// saveImage writes the first image representation of r to a new file in
// dir and says where.
func saveImage(dir, id string, n *int, r corral.Result) (string, bool, error) {
	for _, f := range imageFormats {
		v := f.get(r)
		if v == "" {
			continue
		}
		data := []byte(v)
		if f.base64 {
			var err error
			if data, err = base64.StdEncoding.DecodeString(v); err != nil {
				return "", false, err
			}
		}
		*n++
		name := filepath.Join(dir, fmt.Sprintf("%s-result-%d.%s", id, *n, f.ext))
		return name, true, os.WriteFile(name, data, 0o644)
	}
	return "", false, nil
}

// codeContexts is `corral code contexts ID [--create LANG [--cwd DIR] |
// --restart CTX | --rm CTX]`.
func (c *cli) codeContexts(args []string) int {
	fs := c.flags("code contexts")
	create := fs.String("create", "", "start a context of this language")
	cwd := fs.String("cwd", "", "working directory of the new context")
	restart := fs.String("restart", "", "restart this context (its variables are lost)")
	rm := fs.String("rm", "", "delete this context")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(c.env.Stderr, "usage: corral code contexts ID [--create LANG [--cwd DIR] | --restart CTX | --rm CTX]")
		return exitUsage
	}
	id := fs.Arg(0)
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	switch {
	case *create != "":
		cc, err := client.CreateCodeContext(ctx, id, *create, *cwd)
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.env.Stdout, cc.ID)
	case *restart != "":
		if err := client.RestartCodeContext(ctx, id, *restart); err != nil {
			return c.fail(err)
		}
	case *rm != "":
		if err := client.DeleteCodeContext(ctx, id, *rm); err != nil {
			return c.fail(err)
		}
	default:
		list, err := client.CodeContexts(ctx, id)
		if err != nil {
			return c.fail(err)
		}
		tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD")
		for _, cc := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", cc.ID, cc.Language, cc.Cwd)
		}
		tw.Flush()
	}
	return 0
}
