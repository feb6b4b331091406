package sqsserver

import (
	"fmt"
	"net/http"
)

// Error codes as the SDK reports them: for SQS, an awsQuery-compatible
// service, ErrorCode() is the x-amzn-query-error code, which for several
// shapes is the legacy Query code rather than the shape name.
const (
	codeNonExistentQueue       = "AWS.SimpleQueueService.NonExistentQueue"
	codeQueueAlreadyExists     = "QueueAlreadyExists"
	codeReceiptHandleIsInvalid = "ReceiptHandleIsInvalid"
	codeInvalidAttributeName   = "InvalidAttributeName"
	codeInvalidAttributeValue  = "InvalidAttributeValue"
	codeInvalidMessageContents = "InvalidMessageContents"
	codeInvalidAddress         = "InvalidAddress"
	codeEmptyBatchRequest      = "AWS.SimpleQueueService.EmptyBatchRequest"
	codeTooManyEntries         = "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
	codeBatchIDsNotDistinct    = "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
	codeBatchRequestTooLong    = "AWS.SimpleQueueService.BatchRequestTooLong"
	codeInvalidBatchEntryID    = "AWS.SimpleQueueService.InvalidBatchEntryId"
	codeUnsupportedOperation   = "AWS.SimpleQueueService.UnsupportedOperation"
	codeInvalidParameterValue  = "InvalidParameterValue"
	codeMissingParameter       = "MissingParameter"
	codeInvalidAction          = "InvalidAction"
	codeSerialization          = "SerializationException"
)

// modeledErrors maps a code to the error shape the SQS model declares for
// it and the shape's HTTP status (the model's httpError trait). The SDK
// turns these into their types, e.g. *types.QueueDoesNotExist.
var modeledErrors = map[string]struct {
	shape  string
	status int
}{
	codeNonExistentQueue:       {"QueueDoesNotExist", 400},
	codeQueueAlreadyExists:     {"QueueNameExists", 400},
	codeReceiptHandleIsInvalid: {"ReceiptHandleIsInvalid", 404},
	codeInvalidAttributeName:   {"InvalidAttributeName", 400},
	codeInvalidAttributeValue:  {"InvalidAttributeValue", 400},
	codeInvalidMessageContents: {"InvalidMessageContents", 400},
	codeInvalidAddress:         {"InvalidAddress", 404},
	codeEmptyBatchRequest:      {"EmptyBatchRequest", 400},
	codeTooManyEntries:         {"TooManyEntriesInBatchRequest", 400},
	codeBatchIDsNotDistinct:    {"BatchEntryIdsNotDistinct", 400},
	codeBatchRequestTooLong:    {"BatchRequestTooLong", 400},
	codeInvalidBatchEntryID:    {"InvalidBatchEntryId", 400},
	codeUnsupportedOperation:   {"UnsupportedOperation", 400},
	// Only injected by FailNext: SQS's answers to too many requests.
	"RequestThrottled": {"RequestThrottled", 403},
	"OverLimit":        {"OverLimit", 403},
}

// apiError is an SQS error answer.
type apiError struct {
	code    string
	message string
}

func errorf(code, format string, args ...any) *apiError {
	return &apiError{code: code, message: fmt.Sprintf(format, args...)}
}

// shape is the "__type" of the answer. Codes the model does not declare
// (InvalidParameterValue, MissingParameter, ...) come from the service
// framework, which SQS answers as com.amazon.coral.service#<Code>Exception;
// the SDK reports them by the x-amzn-query-error code either way.
func (e *apiError) shape() string {
	if m, ok := modeledErrors[e.code]; ok {
		return "com.amazonaws.sqs#" + m.shape
	}
	return "com.amazon.coral.service#" + e.code + "Exception"
}

func (e *apiError) status() int {
	if m, ok := modeledErrors[e.code]; ok {
		return m.status
	}
	switch e.code {
	case "InternalError", "InternalFailure":
		return http.StatusInternalServerError
	case "ServiceUnavailable":
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// fault is the second half of x-amzn-query-error: whose fault it was.
func (e *apiError) fault() string {
	if e.status() >= 500 {
		return "Receiver"
	}
	return "Sender"
}
