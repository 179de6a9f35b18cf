// Package ingresspb holds the generated protobuf and gRPC code of the
// ingress's gRPC transport (ingress.proto). Do not edit the .pb.go files:
// edit ingress.proto and regenerate with `go generate` in this directory,
// which needs protoc (Debian: apt-get install protobuf-compiler) and the
// plugins:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package ingresspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ingress.proto
