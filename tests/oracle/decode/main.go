package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"net/http"
	"os"
	"strings"

	"dec/contextresource"
	"dec/pool"
)

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	for sc.Scan() {
		var kind, body string
		line := sc.Bytes()
		var rec []any
		if err := json.Unmarshal(line, &rec); err != nil { panic(err) }
		kind, body = rec[0].(string), rec[1].(string)
		body = body + strings.Repeat(rec[2].(string), int(rec[3].(float64))) + rec[4].(string)
		w := httptest.NewRecorder()
		r := io.NopCloser(bytes.NewReader([]byte(body)))
		lim := http.MaxBytesReader(w, r, 1<<20)
		dec := json.NewDecoder(lim)
		dec.DisallowUnknownFields()
		var err error
		var out any
		if kind == "pool" {
			var req pool.CreateRequest
			err = dec.Decode(&req)
			out = map[string]any{"name": req.Name, "replicas": req.Replicas, "warmPoolRef": req.WarmPoolRef,
				"workspace": map[string]any{"size": req.Workspace.Size, "accessMode": req.Workspace.AccessMode,
					"storageClass": req.Workspace.StorageClass, "claimName": req.Workspace.ClaimName, "readOnly": req.Workspace.ReadOnly}}
		} else {
			var req contextresource.CreateRequest
			err = dec.Decode(&req)
			out = map[string]any{"name": req.Name, "namespace": req.Namespace, "type": req.Type,
				"storage": map[string]any{"backend": req.Storage.Backend, "size": req.Storage.Size,
					"accessMode": req.Storage.AccessMode, "storageClass": req.Storage.StorageClass}}
		}
		var res []string
		if err != nil {
			res = []string{"ERR", err.Error()}
		} else {
			b, _ := json.Marshal(out)
			res = []string{"OK", string(b)}
		}
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
	}
}
