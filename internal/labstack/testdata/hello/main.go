// Command hello is a minimal Lambda function for the labstack tests: it
// greets, logs with slog, and fails or panics on request.
package main

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
)

type request struct {
	Name  string `json:"name"`
	Fail  bool   `json:"fail"`
	Panic bool   `json:"panic"`
}

type response struct {
	Greeting string `json:"greeting"`
	Function string `json:"function"`
	Env      string `json:"env"`
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	lambda.Start(func(ctx context.Context, req request) (response, error) {
		lc, _ := lambdacontext.FromContext(ctx)
		log.Info("hello invoked", "name", req.Name, "requestId", lc.AwsRequestID)
		if req.Fail {
			return response{}, errors.New("asked to fail")
		}
		if req.Panic {
			panic("asked to panic")
		}
		return response{
			Greeting: "hello " + req.Name,
			Function: lambdacontext.FunctionName,
			Env:      os.Getenv("HELLO_ENV"),
		}, nil
	})
}
