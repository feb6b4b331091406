package sqsserver

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// fakeClock stands in for the server's clock, for behaviour that takes
// minutes or hours of real time.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newFakeClockServer(t *testing.T) (*sqs.Client, *Server, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	srv := New()
	srv.now = clock.now // before any request, so no request races the swap
	t.Cleanup(srv.Close)
	client := sqs.New(sqs.Options{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
		HTTPClient:   &http.Client{Transport: BufferedBodies{}},
	})
	return client, srv, clock
}

func TestRetentionPeriod(t *testing.T) {
	ctx := context.Background()
	client, srv, clock := newFakeClockServer(t)
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("short"), Attributes: map[string]string{"MessageRetentionPeriod": "60"}})
	if err != nil {
		t.Fatal(err)
	}
	url := out.QueueUrl
	for _, body := range []string{"old", "in-flight"} {
		if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: url, MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: url}); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Second)
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: url, MessageBody: aws.String("young")}); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Second) // the first two are 60 s old: gone, in flight or not

	if d, _ := srv.Depth("short"); d != (Depth{Visible: 1}) {
		t.Fatalf("depth = %+v, want only the young message", d)
	}
	got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: url, MaxNumberOfMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 1 || aws.ToString(got.Messages[0].Body) != "young" {
		t.Fatalf("received %+v, want only the young message", got.Messages)
	}
}
