package main

import (
	"bufio"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		in := sc.Text()
		q, err := resource.ParseQuantity(in)
		if err != nil {
			fmt.Printf("%q\tERR\n", in)
			continue
		}
		s := q.String()
		r := q.DeepCopy()
		r.RoundUp(-3) // SetDefaults_ResourceList: what a PVC request is stored as
		fmt.Printf("%q\t%q\t%q\t%d\n", in, s, r.String(), q.Sign())
	}
}
