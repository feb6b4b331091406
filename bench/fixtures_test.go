package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
)

// pass is one batch of exits ready to handle: a running Pod per exit, its
// managed instance on the EC2 test server and the payload CloudWatch Logs
// would deliver. Exits are one-shot, so every pass gets fresh ones.
type pass struct {
	ns       string
	ids      []string
	payloads [][]byte
}

// prepare creates n exits (exit code 0) in a namespace of their own.
func (w *world) prepare(ctx context.Context, n int) (*pass, error) {
	w.mu.Lock()
	w.passes++
	seq := w.passes
	w.mu.Unlock()
	p := &pass{ns: fmt.Sprintf("bench-%03d", seq)}
	exits, err := w.lab.CreateExits(ctx, p.ns, n, func(i int) (string, string, int) {
		return fmt.Sprintf("exit-%04d", i), fmt.Sprintf("i-0be4c%06x%06x", seq, i), 0
	}, nil)
	if err != nil {
		return nil, err
	}
	for _, e := range exits {
		p.ids, p.payloads = append(p.ids, e.InstanceID), append(p.payloads, e.Payload)
	}
	return p, nil
}

// cleanup removes a pass's Pods, Events and instances, so that every pass
// meets a stack of the same size. The work queue must be empty by then
// (receive takes the work items off it).
func (w *world) cleanup(ctx context.Context, p *pass) error {
	for _, id := range p.ids {
		w.stack.EC2.RemoveInstance(id)
	}
	w.stack.EC2.ResetCalls()
	w.stack.SQS.ResetCalls()
	now := int64(0)
	if err := w.stack.Kube.CoreV1().Pods(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{}); err != nil {
		return err
	}
	return w.stack.Kube.CoreV1().Events(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
}

func (w *world) sqs(ctx context.Context) *sqs.Client {
	return sqs.NewFromConfig(w.stack.AWSConfig(ctx))
}

// receive takes n messages off the work queue, as the event source mapping
// would, and returns them as the reconciler's events of at most size
// records each. They are deleted at once: the in-process reconciler's
// batches are not redelivered.
func (w *world) receive(ctx context.Context, n, size int) ([]events.SQSEvent, error) {
	q := w.sqs(ctx)
	arn := sqsserver.QueueARN(w.lab.QueueURL[strings.LastIndex(w.lab.QueueURL, "/")+1:])
	var recs []events.SQSMessage
	for len(recs) < n {
		out, err := q.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(w.lab.QueueURL), MaxNumberOfMessages: 10, VisibilityTimeout: 600,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return nil, err
		}
		if len(out.Messages) == 0 {
			return nil, fmt.Errorf("work queue: %d messages, want %d", len(recs), n)
		}
		var done []sqstypes.DeleteMessageBatchRequestEntry
		for i, m := range out.Messages {
			recs = append(recs, events.SQSMessage{
				MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body),
				Attributes: m.Attributes, EventSource: "aws:sqs", EventSourceARN: arn, AWSRegion: labstack.Region,
			})
			done = append(done, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		if _, err := q.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(w.lab.QueueURL), Entries: done}); err != nil {
			return nil, err
		}
	}
	var out []events.SQSEvent
	for chunk := range slices.Chunk(recs, size) {
		out = append(out, events.SQSEvent{Records: chunk})
	}
	return out, nil
}
