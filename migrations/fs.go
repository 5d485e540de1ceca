package migrations

import (
	"bytes"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"
)

// The migration files, with "{{schema}}" where the schema name goes.
//
//go:embed sql/*.sql
var embedded embed.FS

const schemaPlaceholder = "{{schema}}"

// render returns the migrations with the placeholder replaced by schema, as a flat
// read-only file system for goose. schema must be validated already.
func render(schema string) (fs.FS, error) {
	entries, err := fs.ReadDir(embedded, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: read embedded files: %w", err)
	}
	files := make(memFS, len(entries))
	for _, e := range entries {
		b, err := fs.ReadFile(embedded, "sql/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("migrations: read embedded %s: %w", e.Name(), err)
		}
		files[e.Name()] = []byte(strings.ReplaceAll(string(b), schemaPlaceholder, schema))
	}
	return files, nil
}

// memFS is a flat, read-only in-memory file system: file name → content.
type memFS map[string][]byte

var (
	_ fs.ReadDirFS  = memFS(nil)
	_ fs.ReadFileFS = memFS(nil)
)

func (m memFS) Open(name string) (fs.File, error) {
	if name == "." {
		return &memDir{info: memInfo{name: ".", dir: true}, fsys: m}, nil
	}
	b, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &memFile{info: memInfo{name: name, size: int64(len(b))}, r: bytes.NewReader(b)}, nil
}

func (m memFS) ReadFile(name string) ([]byte, error) {
	b, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return bytes.Clone(b), nil
}

func (m memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	out := make([]fs.DirEntry, 0, len(m))
	for n, b := range m {
		out = append(out, fs.FileInfoToDirEntry(memInfo{name: n, size: int64(len(b))}))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}

type memFile struct {
	info memInfo
	r    *bytes.Reader
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *memFile) Close() error               { return nil }

type memDir struct {
	info memInfo
	fsys memFS
	rest []fs.DirEntry
	read bool
}

func (d *memDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}
func (d *memDir) Close() error { return nil }

// ReadDir implements fs.ReadDirFile.
func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	if !d.read {
		d.rest, _ = d.fsys.ReadDir(".")
		d.read = true
	}
	if n <= 0 {
		out := d.rest
		d.rest = nil
		return out, nil
	}
	if len(d.rest) == 0 {
		return nil, io.EOF
	}
	k := min(n, len(d.rest))
	out := d.rest[:k]
	d.rest = d.rest[k:]
	return out, nil
}
