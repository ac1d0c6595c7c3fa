package ociimage

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// Instruction is one instruction of a build file (a Dockerfile), with its
// continuation lines joined.
type Instruction struct {
	// Line is the 1-based line the instruction starts on.
	Line int `json:"line"`
	// Cmd is the keyword in upper case: "FROM", "RUN", ...
	Cmd string `json:"cmd"`
	// Flags are the leading "--name=value" words of FROM, RUN, COPY and
	// ADD.
	Flags []string `json:"flags,omitempty"`
	// Args is the rest of the instruction after the keyword and flags.
	Args string `json:"args"`
	// JSON holds the arguments when they are written as a JSON array of
	// strings (the exec form of RUN, CMD and ENTRYPOINT; COPY and ADD
	// also accept it); it is nil for the shell form.
	JSON []string `json:"json,omitempty"`
	// Text is the instruction as written, for messages.
	Text string `json:"text"`

	// The fields below are set by callers that make instructions
	// themselves (the E2B facade's template builds); a build file cannot
	// set them.
	//
	// FromTemplate, on a FROM without arguments, names a tree of this host
	// (Builder.Local) to start from instead of an image.
	FromTemplate string `json:"-"`
	// RunAs, on a RUN, is the user this step alone runs as, instead of the
	// one the last USER set.
	RunAs string `json:"-"`
}

// supported reports whether builds understand the instruction. CMD,
// ENTRYPOINT and LABEL change only the Defaults of the result.
func supported(cmd string) bool {
	switch cmd {
	case "FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "CMD", "ENTRYPOINT", "LABEL":
		return true
	}
	return false
}

// unsupported reports whether cmd is one of the other Dockerfile
// instructions, refused with errdefs.ErrNotImplemented rather than as an
// unknown word.
func unsupported(cmd string) bool {
	switch cmd {
	case "EXPOSE", "VOLUME", "HEALTHCHECK", "ONBUILD", "SHELL", "STOPSIGNAL", "MAINTAINER":
		return true
	}
	return false
}

// heredoc matches the start of a BuildKit here-document ("<<EOF",
// "<<-'EOF'").
var heredoc = regexp.MustCompile(`<<-?["']?[A-Za-z_][A-Za-z0-9_]*`)

// ParseBuildFile reads a build file: the Dockerfile subset of FROM, RUN
// (shell and exec forms), COPY, ADD, ENV, WORKDIR, USER, ARG, CMD,
// ENTRYPOINT and LABEL, with comments and backslash line continuations.
// Other instructions, parser directives other than syntax, and
// here-documents are refused with an error naming the line; the error
// wraps errdefs.ErrNotImplemented for Dockerfile features not supported
// here and errdefs.ErrInvalidArgument for what is not a Dockerfile at all.
// It checks only the syntax; Plan checks the meaning.
func ParseBuildFile(r io.Reader) ([]Instruction, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading build file: %w", err)
	}
	var out []Instruction
	directives := true
	for i := 0; i < len(lines); {
		trimmed := strings.TrimSpace(lines[i])
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			if directives && strings.HasPrefix(trimmed, "#") {
				if err := directive(i+1, trimmed); err != nil {
					return nil, err
				}
			} else {
				directives = false
			}
			i++
			continue
		}
		directives = false
		start := i + 1
		var text strings.Builder
		for i < len(lines) {
			l := strings.TrimRight(lines[i], " \t")
			i++
			if body, ok := strings.CutSuffix(l, `\`); ok {
				text.WriteString(body)
				// Comment and empty lines inside a continuation are
				// dropped, as Docker does.
				for i < len(lines) {
					t := strings.TrimSpace(lines[i])
					if t != "" && !strings.HasPrefix(t, "#") {
						break
					}
					i++
				}
				continue
			}
			text.WriteString(l)
			break
		}
		ins, err := parseInstruction(start, strings.TrimSpace(text.String()))
		if err != nil {
			return nil, err
		}
		out = append(out, ins)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("build file has no instructions: %w", errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// directive checks a comment at the top of the file that may be a parser
// directive ("# syntax=...", "# escape=...").
func directive(line int, comment string) error {
	key, value, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(comment, "#")), "=")
	if !ok {
		return nil
	}
	switch strings.ToLower(strings.TrimSpace(key)) {
	case "escape":
		if strings.TrimSpace(value) != `\` {
			return fmt.Errorf("line %d: the escape directive is not supported: %w", line, errdefs.ErrNotImplemented)
		}
	case "check":
		// A linter setting; it changes nothing in the build.
	case "syntax":
		// Names a BuildKit frontend; the subset here is its own.
	}
	return nil
}

func parseInstruction(line int, text string) (Instruction, error) {
	word, rest := text, ""
	if i := strings.IndexAny(text, " \t"); i >= 0 {
		word, rest = text[:i], text[i+1:]
	}
	cmd := strings.ToUpper(word)
	ins := Instruction{Line: line, Cmd: cmd, Text: text}
	switch {
	case unsupported(cmd):
		return ins, fmt.Errorf("line %d: %s is not supported in builds (supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, CMD, ENTRYPOINT, LABEL): %w", line, cmd, errdefs.ErrNotImplemented)
	case !supported(cmd):
		return ins, fmt.Errorf("line %d: unknown instruction %q: %w", line, word, errdefs.ErrInvalidArgument)
	}
	rest = strings.TrimSpace(rest)
	switch cmd {
	case "FROM", "RUN", "COPY", "ADD":
		for strings.HasPrefix(rest, "--") {
			flag, after := rest, ""
			if i := strings.IndexAny(rest, " \t"); i >= 0 {
				flag, after = rest[:i], rest[i+1:]
			}
			ins.Flags = append(ins.Flags, flag)
			rest = strings.TrimSpace(after)
		}
	}
	ins.Args = rest
	if strings.HasPrefix(rest, "[") {
		var words []string
		if err := json.Unmarshal([]byte(rest), &words); err == nil {
			ins.JSON = words
		}
	}
	if ins.JSON == nil && (cmd == "RUN" || cmd == "COPY" || cmd == "ADD") && heredoc.MatchString(rest) {
		return ins, fmt.Errorf("line %d: here-documents are not supported: %w", line, errdefs.ErrNotImplemented)
	}
	if rest == "" && cmd != "CMD" && cmd != "ENTRYPOINT" {
		return ins, fmt.Errorf("line %d: %s needs arguments: %w", line, cmd, errdefs.ErrInvalidArgument)
	}
	return ins, nil
}

// lexer expands variables and removes quotes the way a Dockerfile does for
// the arguments of FROM, ENV, ARG, LABEL, WORKDIR, USER, COPY and ADD:
// '...' is literal, "..." expands variables and honors \" \\ \$, a
// backslash outside quotes escapes the next character, and $NAME, ${NAME},
// ${NAME:-word} and ${NAME:+word} are replaced. Unset variables expand to
// nothing.
type lexer struct {
	lookup func(string) (string, bool)
}

// words splits s into words on unquoted whitespace.
func (lx lexer) words(s string) ([]string, error) { return lx.process(s, true) }

// word processes s as one word, keeping its whitespace.
func (lx lexer) word(s string) (string, error) {
	w, err := lx.process(s, false)
	if err != nil || len(w) == 0 {
		return "", err
	}
	return w[0], nil
}

func (lx lexer) process(s string, split bool) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			out = append(out, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case split && (c == ' ' || c == '\t'):
			flush()
		case c == '\\':
			inWord = true
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
		case c == '\'':
			inWord = true
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unterminated single quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
		case c == '"':
			inWord = true
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				switch {
				case s[j] == '\\' && j+1 < len(s) && strings.IndexByte(`"\$`, s[j+1]) >= 0:
					j++
					cur.WriteByte(s[j])
				case s[j] == '$':
					v, n, err := lx.variable(s[j:])
					if err != nil {
						return nil, err
					}
					cur.WriteString(v)
					j += n - 1
				default:
					cur.WriteByte(s[j])
				}
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated double quote in %q", s)
			}
			i = j
		case c == '$':
			inWord = true
			v, n, err := lx.variable(s[i:])
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i += n - 1
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	flush()
	return out, nil
}

// variable expands the reference at the start of s (which begins with
// '$') and returns its value and length.
func (lx lexer) variable(s string) (string, int, error) {
	if len(s) < 2 {
		return "$", 1, nil
	}
	if s[1] != '{' {
		n := 1
		for n < len(s) && isNameByte(s[n], n == 1) {
			n++
		}
		if n == 1 {
			return "$", 1, nil
		}
		v, _ := lx.lookup(s[1:n])
		return v, n, nil
	}
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return "", 0, fmt.Errorf("unterminated ${ in %q", s)
	}
	body := s[2:end]
	name, op, word := body, "", ""
	if i := strings.Index(body, ":"); i >= 0 {
		if len(body) < i+2 {
			return "", 0, fmt.Errorf("bad substitution ${%s}", body)
		}
		name, op, word = body[:i], body[i:i+2], body[i+2:]
	}
	if name == "" {
		return "", 0, fmt.Errorf("bad substitution ${%s}", body)
	}
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i], i == 0) {
			return "", 0, fmt.Errorf("bad substitution ${%s}", body)
		}
	}
	v, ok := lx.lookup(name)
	switch op {
	case "":
	case ":-":
		if !ok || v == "" {
			w, err := lx.word(word)
			return w, end + 1, err
		}
	case ":+":
		if ok && v != "" {
			w, err := lx.word(word)
			return w, end + 1, err
		}
		return "", end + 1, nil
	default:
		return "", 0, fmt.Errorf("substitution ${%s} is not supported (only ${NAME:-word} and ${NAME:+word})", body)
	}
	return v, end + 1, nil
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
}
