package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/ociimage"
	corral "github.com/corralrun/corral/sdk"
)

// streamTo returns stream options that print log lines and progress on
// the CLI's stderr (a progress bar on a terminal, plain lines otherwise),
// and the function that ends the progress output.
func (c *cli) streamTo() (corral.StreamOptions, func()) {
	pp := ociimage.NewProgressPrinter(c.env.Stderr)
	return corral.StreamOptions{
		Log: &closingLog{w: c.env.Stderr, pp: pp},
		Progress: func(p corral.Progress) {
			pp.Update(ociimage.Progress{Action: p.Action, ID: p.ID, Current: p.Current, Total: p.Total, Cached: p.Cached, Done: p.Done})
		},
	}, func() { _ = pp.Close() }
}

// closingLog ends the progress bar's line before a log line, so that the
// two do not share a line on a terminal.
type closingLog struct {
	w  io.Writer
	pp *ociimage.ProgressPrinter
}

func (l *closingLog) Write(p []byte) (int, error) {
	_ = l.pp.Close()
	return l.w.Write(p)
}

// templatePull runs `corral template pull NAME REF [--platform P] [--insecure]`.
func (c *cli) templatePull(ctx context.Context, client *corral.Client, args []string) int {
	fs := c.flags("template pull")
	platform := fs.String("platform", "", "platform of a multi-platform image, e.g. linux/arm64 (default linux/amd64)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	var sf serviceFlags
	sf.register(fs, true)
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) != 2 {
		fmt.Fprintln(c.env.Stderr, "usage: corral template pull NAME REF [--platform P] [--insecure] [--start CMD [--ready CMD] ...]")
		return exitUsage
	}
	sv, err := sf.service()
	if err != nil {
		fmt.Fprintf(c.env.Stderr, "corral template pull: %v\n", err)
		return exitUsage
	}
	stream, done := c.streamTo()
	t, err := client.PullTemplate(ctx, pos[0], corral.PullOptions{Ref: pos[1], Platform: *platform, Insecure: *insecure, Service: sv}, stream)
	done()
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// buildFlags are the flags of `corral template build`: the recipe ones
// and the Dockerfile ones, which do not mix.
type buildFlags struct {
	recipe, mirror     string
	essential          bool
	file               string
	buildArgs, domains multiFlag
	platform, network  string
	insecure, noCache  bool
	service            serviceFlags
}

func (f *buildFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.recipe, "recipe", "", "debian (default when no Dockerfile is given), code-interpreter or busybox")
	fs.StringVar(&f.mirror, "mirror", "", "Debian mirror URL (debian recipe)")
	fs.BoolVar(&f.essential, "build-essential", false, "include compilers (debian recipe)")
	fs.StringVar(&f.file, "f", "", "Dockerfile to build (- for stdin; default CONTEXT/Dockerfile)")
	fs.Var(&f.buildArgs, "build-arg", "build argument K=V, or K to take its value from the environment (repeatable)")
	fs.StringVar(&f.platform, "platform", "", "platform of the FROM image (default linux/amd64)")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plain HTTP to the FROM image's registry")
	fs.BoolVar(&f.noCache, "no-cache", false, "run every step, even those whose result is cached")
	fs.StringVar(&f.network, "network", "", "network of RUN steps: none (default), allowlist or open")
	fs.Var(&f.domains, "allow-domain", "a domain RUN steps may reach (repeatable; implies --network allowlist)")
	f.service.register(fs, true)
}

// templateBuild runs `corral template build`: from a recipe
// (NAME [--recipe debian|busybox]) or from a Dockerfile
// (NAME -f FILE [CONTEXT], or NAME CONTEXT with CONTEXT/Dockerfile).
func (c *cli) templateBuild(ctx context.Context, client *corral.Client, args []string) int {
	const usage = "usage: corral template build NAME [--recipe debian|busybox]\n" +
		"       corral template build NAME [-f Dockerfile] [CONTEXT] [--build-arg K=V]... [--platform P] [--insecure] [--no-cache]"
	fs := c.flags("template build")
	var f buildFlags
	f.register(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil || len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(c.env.Stderr, usage)
		return exitUsage
	}
	name, contextDir := pos[0], ""
	if len(pos) == 2 {
		contextDir = pos[1]
	}
	if f.file == "" && contextDir == "" {
		return c.buildRecipe(ctx, client, name, &f)
	}
	return c.buildDockerfile(ctx, client, name, contextDir, &f)
}

// buildRecipe builds template name from a recipe (debian by default).
func (c *cli) buildRecipe(ctx context.Context, client *corral.Client, name string, f *buildFlags) int {
	if f.network != "" || len(f.domains) > 0 || len(f.buildArgs) > 0 || f.platform != "" || f.insecure || f.noCache {
		fmt.Fprintln(c.env.Stderr, "corral template build: --build-arg, --platform, --insecure, --no-cache, --network and --allow-domain need a Dockerfile (-f FILE or CONTEXT)")
		return exitUsage
	}
	recipe := f.recipe
	if recipe == "" {
		recipe = "debian"
	}
	sv, err := f.service.service()
	if err != nil {
		fmt.Fprintf(c.env.Stderr, "corral template build: %v\n", err)
		return exitUsage
	}
	t, err := client.BuildTemplate(ctx, name, corral.BuildOptions{Recipe: recipe, Mirror: f.mirror, BuildEssential: f.essential, Service: sv}, c.env.Stderr)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// buildDockerfile builds template name from the Dockerfile of -f, or of
// the context directory.
func (c *cli) buildDockerfile(ctx context.Context, client *corral.Client, name, contextDir string, f *buildFlags) int {
	if f.recipe != "" || f.mirror != "" || f.essential {
		fmt.Fprintln(c.env.Stderr, "corral template build: --recipe, --mirror and --build-essential do not apply to a Dockerfile build")
		return exitUsage
	}
	opts := corral.DockerfileOptions{ContextDir: contextDir, Platform: f.platform, Insecure: f.insecure, NoCache: f.noCache, Args: map[string]string{},
		Network: f.network, AllowDomains: f.domains}
	for _, kv := range f.buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			// As docker does: a bare name passes the variable's value
			// from this environment, and nothing when it is unset.
			if v, ok = lookupEnv(c.env.Getenv, k); !ok {
				continue
			}
		}
		if k == "" {
			fmt.Fprintf(c.env.Stderr, "corral template build: --build-arg %q has no name\n", kv)
			return exitUsage
		}
		opts.Args[k] = v
	}
	svc, err := f.service.dockerfile()
	if err != nil {
		fmt.Fprintf(c.env.Stderr, "corral template build: %v\n", err)
		return exitUsage
	}
	opts.Service = svc
	file := f.file
	if file == "" {
		file = filepath.Join(contextDir, "Dockerfile")
	}
	if file == "-" {
		opts.Dockerfile, err = io.ReadAll(c.env.Stdin)
	} else {
		opts.Dockerfile, err = os.ReadFile(file)
	}
	if err != nil {
		return c.fail(fmt.Errorf("reading the Dockerfile: %w", err))
	}
	stream, done := c.streamTo()
	t, err := client.BuildTemplateFromDockerfile(ctx, name, opts, stream)
	done()
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.env.Stdout, t.Name)
	return 0
}

// lookupEnv is os.LookupEnv through the CLI's environment; an empty value
// counts as unset.
func lookupEnv(getenv func(string) string, k string) (string, bool) {
	v := getenv(k)
	return v, v != ""
}

// parseInterspersed parses flags anywhere among the positional arguments
// ("NAME -f F DIR", "-f F NAME DIR", "NAME DIR -f F") and returns the
// positional ones. "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
