// Command trivial is the floor of the peer comparison: a net/http server
// that reads the request body and answers 200 with a small JSON object,
// doing no work a rate limiter would do.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
)

var answer = []byte(`{"allowed":true,"remaining":999}` + "\n")

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to listen on")
	flag.Parse()
	length := strconv.Itoa(len(answer))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", length)
		w.Write(answer)
	})
	if err := http.ListenAndServe(*listen, h); err != nil {
		fmt.Fprintln(os.Stderr, "trivial:", err)
		os.Exit(1)
	}
}
