package configsource

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxDepth bounds how deep a directory is walked, so that a symbolic link
// to a parent cannot make a walk endless.
const maxDepth = 8

// maxFiles bounds the files one source reads.
const maxFiles = 1000

// File is one configuration file as read: its path and its bytes.
type File struct {
	Path string
	Data []byte
}

// Files are the files of one source in path order.
type Files []File

// Fingerprint is a hash of the paths and bytes of fs: two reads with the
// same fingerprint read the same configuration.
func (fs Files) Fingerprint() string {
	h := sha256.New()
	for _, f := range fs {
		fmt.Fprintf(h, "%d:%s\x00%d:", len(f.Path), f.Path, len(f.Data))
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ReadFiles reads the files that paths name: a path to a file is that
// file (whatever its name); a path to a directory is every file under it,
// subdirectories included, whose name ends in one of exts, in path order.
// Entries whose name begins with a dot are skipped, so a Kubernetes
// ConfigMap volume (its files are symbolic links through "..data" to a
// hidden timestamped directory) is read once, through the links. Symbolic
// links are followed. Each file is at most maxBytes.
//
// With strict (at start), a path that does not exist, or a directory with
// no such file, is an error. Without it (on a reload), a missing path
// holds no files: a file deleted is configuration removed.
func ReadFiles(paths []string, exts []string, maxBytes int64, strict bool) (Files, error) {
	var out Files
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			if !strict && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, err
		}
		if !st.IsDir() {
			f, err := readFile(p, maxBytes)
			if err != nil {
				if !strict && errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return nil, err
			}
			out = append(out, f)
			continue
		}
		n := len(out)
		if out, err = walk(out, p, exts, maxBytes, 0); err != nil {
			return nil, err
		}
		if strict && len(out) == n {
			return nil, fmt.Errorf("%s: no %s file in this directory", p, strings.Join(globs(exts), " or "))
		}
	}
	slices.SortStableFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return slices.CompactFunc(out, func(a, b File) bool { return a.Path == b.Path }), nil
}

func globs(exts []string) []string {
	out := make([]string, len(exts))
	for i, e := range exts {
		out[i] = "*" + e
	}
	return out
}

// walk appends the files under dir whose names end in one of exts.
func walk(out Files, dir string, exts []string, maxBytes int64, depth int) (Files, error) {
	if depth > maxDepth {
		return out, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return out, nil // removed while walked: the next read sees it gone
		}
		return nil, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		st, err := os.Stat(p) // follows links
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // a dangling link, or removed while walked
			}
			return nil, err
		}
		if st.IsDir() {
			if out, err = walk(out, p, exts, maxBytes, depth+1); err != nil {
				return nil, err
			}
			continue
		}
		if !slices.Contains(exts, filepath.Ext(e.Name())) {
			continue
		}
		if len(out) >= maxFiles {
			return nil, fmt.Errorf("%s: more than %d configuration files", dir, maxFiles)
		}
		f, err := readFile(p, maxBytes)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func readFile(p string, maxBytes int64) (File, error) {
	fh, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxBytes+1))
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", p, err)
	}
	if int64(len(data)) > maxBytes {
		return File{}, &Error{File: p, Reason: fmt.Sprintf("more than %d bytes", maxBytes)}
	}
	return File{Path: p, Data: data}, nil
}
