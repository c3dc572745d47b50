// etcd's own server, started as its etcd binary does: etcdmain is the whole of it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
