package sqsserver

import (
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// queueAttributes are the settable attributes the server models, in the
// units of the API (seconds, bytes).
type queueAttributes struct {
	visibilityTimeout  int
	maximumMessageSize int
	retention          int
	delay              int
	receiveWait        int
	redrive            *redrivePolicy
}

type redrivePolicy struct {
	DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	MaxReceiveCount     int    `json:"maxReceiveCount"`
}

// SQS's defaults for a new queue (CreateQueue reference).
var defaultQueueAttributes = queueAttributes{
	visibilityTimeout:  30,
	maximumMessageSize: 1 << 20,
	retention:          4 * 24 * 3600,
}

// intAttributes maps each integer attribute to its field and SQS's bounds.
var intAttributes = map[string]struct {
	field    func(*queueAttributes) *int
	min, max int
}{
	"VisibilityTimeout":             {func(a *queueAttributes) *int { return &a.visibilityTimeout }, 0, 43200},
	"MaximumMessageSize":            {func(a *queueAttributes) *int { return &a.maximumMessageSize }, 1024, 1 << 20},
	"MessageRetentionPeriod":        {func(a *queueAttributes) *int { return &a.retention }, 60, 14 * 24 * 3600},
	"DelaySeconds":                  {func(a *queueAttributes) *int { return &a.delay }, 0, 900},
	"ReceiveMessageWaitTimeSeconds": {func(a *queueAttributes) *int { return &a.receiveWait }, 0, 20},
}

// Attribute names SQS knows but the server does not model: setting one is
// refused as unsupported rather than as unknown.
var unmodeledAttributes = []string{
	"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled",
	"RedriveAllowPolicy", "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit",
}

// Read-only attributes GetQueueAttributes reports.
var computedAttributes = []string{
	"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed",
	"CreatedTimestamp", "LastModifiedTimestamp", "QueueArn",
}

// set applies one attribute from CreateQueue. The dead-letter target's
// existence is checked by the caller, which knows the queues.
func (a *queueAttributes) set(name, value string) *apiError {
	if ia, ok := intAttributes[name]; ok {
		n, err := strconv.Atoi(value)
		if err != nil || n < ia.min || n > ia.max {
			return errorf(codeInvalidAttributeValue, "Invalid value for the parameter %s.", name)
		}
		*ia.field(a) = n
		return nil
	}
	switch {
	case name == "RedrivePolicy":
		if value == "" { // SQS's way of saying "no dead-letter queue"
			a.redrive = nil
			return nil
		}
		rp, ok := parseRedrivePolicy(value)
		if !ok {
			return errorf(codeInvalidParameterValue, "Value %s for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map or has an invalid deadLetterTargetArn or maxReceiveCount (1 to 1000).", value)
		}
		a.redrive = rp
		return nil
	case slices.Contains(unmodeledAttributes, name):
		return errorf(codeUnsupportedOperation, "sqsserver does not model the queue attribute %s.", name)
	default:
		return errorf(codeInvalidAttributeName, "Unknown Attribute %s.", name)
	}
}

// parseRedrivePolicy accepts maxReceiveCount as a number or a numeric
// string, as SQS does.
func parseRedrivePolicy(value string) (*redrivePolicy, bool) {
	var raw struct {
		DeadLetterTargetArn string          `json:"deadLetterTargetArn"`
		MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(value), &raw); err != nil || raw.DeadLetterTargetArn == "" {
		return nil, false
	}
	count, err := strconv.Atoi(strings.Trim(string(raw.MaxReceiveCount), `"`))
	if err != nil || count < 1 || count > 1000 {
		return nil, false
	}
	return &redrivePolicy{DeadLetterTargetArn: raw.DeadLetterTargetArn, MaxReceiveCount: count}, true
}

// get renders a settable attribute as GetQueueAttributes does; ok is false
// for attributes that are unset (a missing RedrivePolicy) or not settable.
func (a *queueAttributes) get(name string) (string, bool) {
	if ia, ok := intAttributes[name]; ok {
		return strconv.Itoa(*ia.field(a)), true
	}
	if name == "RedrivePolicy" && a.redrive != nil {
		b, _ := json.Marshal(a.redrive)
		return string(b), true
	}
	return "", false
}

// attributeValue is a message attribute as the JSON protocol carries it.
type attributeValue struct {
	DataType         string   `json:"DataType"`
	StringValue      *string  `json:"StringValue,omitempty"`
	BinaryValue      []byte   `json:"BinaryValue,omitempty"`
	StringListValues []string `json:"StringListValues,omitempty"`
	BinaryListValues [][]byte `json:"BinaryListValues,omitempty"`
}

func (v attributeValue) isBinary() bool {
	base, _, _ := strings.Cut(v.DataType, ".")
	return base == "Binary"
}

const maxMessageAttributes = 10

var (
	attributeNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,256}$`)
	numberPattern        = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)
)

// checkMessageAttributes validates message attributes as SQS does and
// returns the bytes they add to the message size (names, types and values
// all count towards MaximumMessageSize).
func checkMessageAttributes(attrs map[string]attributeValue) (int, *apiError) {
	if len(attrs) > maxMessageAttributes {
		return 0, errorf(codeInvalidParameterValue, "Number of message attributes [%d] exceeds the allowed maximum [%d].", len(attrs), maxMessageAttributes)
	}
	size := 0
	for name, v := range attrs {
		lower := strings.ToLower(name)
		if !attributeNamePattern.MatchString(name) || strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon.") ||
			strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
			return 0, errorf(codeInvalidParameterValue, "Message (user) attribute name '%s' is invalid.", name)
		}
		base, custom, hasCustom := strings.Cut(v.DataType, ".")
		if (base != "String" && base != "Number" && base != "Binary") || (hasCustom && custom == "") || len(v.DataType) > 256 {
			return 0, errorf(codeInvalidParameterValue, "The type of message (user) attribute '%s' is invalid. You must use only the following supported type prefixes: Binary, Number, String.", name)
		}
		if len(v.StringListValues) > 0 || len(v.BinaryListValues) > 0 {
			return 0, errorf(codeInvalidParameterValue, "Message (user) attribute '%s': list values are reserved for future use.", name)
		}
		var value int
		if base == "Binary" {
			if len(v.BinaryValue) == 0 || v.StringValue != nil {
				return 0, errorf(codeInvalidParameterValue, "Message (user) attribute '%s' must contain a non-empty value of type 'Binary'.", name)
			}
			value = len(v.BinaryValue)
		} else {
			if v.StringValue == nil || *v.StringValue == "" || v.BinaryValue != nil {
				return 0, errorf(codeInvalidParameterValue, "Message (user) attribute '%s' must contain a non-empty value of type '%s'.", name, base)
			}
			if r, ok := invalidRune(*v.StringValue); !ok {
				return 0, errorf(codeInvalidParameterValue, "Message (user) attribute '%s' contains the invalid character #x%X.", name, r)
			}
			if base == "Number" && !numberPattern.MatchString(*v.StringValue) {
				return 0, errorf(codeInvalidParameterValue, "Value %s for message (user) attribute '%s' of type 'Number' is not a number.", *v.StringValue, name)
			}
			value = len(*v.StringValue)
		}
		size += len(name) + len(v.DataType) + value
	}
	return size, nil
}

// invalidRune reports the first character SQS refuses in message text, if
// any. Allowed: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD |
// #x10000 to #x10FFFF (SendMessage reference).
func invalidRune(s string) (rune, bool) {
	for _, r := range s {
		switch {
		case r == 0x9, r == 0xA, r == 0xD,
			r >= 0x20 && r <= 0xD7FF,
			r >= 0xE000 && r <= 0xFFFD,
			r >= 0x10000 && r <= 0x10FFFF:
		default:
			return r, false
		}
	}
	return 0, true
}

func md5Hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// md5OfAttributes computes MD5OfMessageAttributes the way SQS documents it
// ("Calculating the MD5 message digest for message attributes"): attributes
// sorted by name, each encoded as length-prefixed (4 bytes, big endian)
// name and data type, a transport byte (1 string/number, 2 binary) and the
// length-prefixed value. Empty for no attributes, as SQS omits the digest.
func md5OfAttributes(attrs map[string]attributeValue) string {
	if len(attrs) == 0 {
		return ""
	}
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names)
	h := md5.New()
	for _, name := range names {
		v := attrs[name]
		writeLengthPrefixed(h, []byte(name))
		writeLengthPrefixed(h, []byte(v.DataType))
		if v.isBinary() {
			h.Write([]byte{2})
			writeLengthPrefixed(h, v.BinaryValue)
		} else {
			h.Write([]byte{1})
			writeLengthPrefixed(h, []byte(*v.StringValue))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeLengthPrefixed(h hash.Hash, b []byte) {
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
	h.Write(b)
}

// selectAttributes keeps the message attributes a ReceiveMessage asked for
// by MessageAttributeNames: "All" or ".*" for every one, "prefix.*" for a
// prefix, otherwise exact names.
func selectAttributes(attrs map[string]attributeValue, names []string) map[string]attributeValue {
	out := map[string]attributeValue{}
	for name, v := range attrs {
		for _, want := range names {
			prefix, isPrefix := strings.CutSuffix(want, ".*")
			if want == "All" || want == ".*" || want == name || (isPrefix && strings.HasPrefix(name, prefix+".")) {
				out[name] = v
				break
			}
		}
	}
	return out
}
