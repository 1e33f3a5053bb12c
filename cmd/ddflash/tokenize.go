package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"ddflash/tokenizer"
)

func init() {
	register("tokenize", "encode text to token ids, or decode ids to text (JSON lines)", runTokenize)
}

func runTokenize(args []string) error {
	return tokenizeStreams(args, os.Stdin, os.Stdout)
}

func tokenizeStreams(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: ddflash tokenize (--tokenizer FILE | --model DIR) [--jsonl] [--decode] [flags] < input

Encodes stdin to token ids. With --jsonl, each input line is a JSON string
and each output line the JSON array of its ids; without it, all of stdin is
one text and the output one array. --decode goes the other way: arrays of ids
in, JSON strings (or, without --jsonl, the raw text) out.`)
		fs.PrintDefaults()
	}
	tokFile := fs.String("tokenizer", "", "a Hugging Face tokenizer.json file")
	modelDir := fs.String("model", "", "a model directory holding tokenizer.json")
	jsonl := fs.Bool("jsonl", false, "one JSON value per line in and out")
	decode := fs.Bool("decode", false, "decode arrays of ids into text")
	specialAsText := fs.Bool("special-as-text", false, "encode special tokens written in the text (such as <|im_start|>) as plain text")
	skipSpecial := fs.Bool("skip-special", false, "leave special tokens out when decoding")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (input comes from stdin)", fs.Arg(0))
	}
	var tok *tokenizer.Tokenizer
	var err error
	switch {
	case (*tokFile == "") == (*modelDir == ""):
		return errors.New("give exactly one of --tokenizer FILE and --model DIR")
	case *tokFile != "":
		tok, err = tokenizer.Load(*tokFile)
	default:
		var d *tokenizer.Dir
		d, err = tokenizer.LoadDir(*modelDir)
		if d != nil {
			tok = d.Tokenizer
		}
	}
	if err != nil {
		return err
	}

	opts := tokenizer.EncodeOptions{SpecialAsText: *specialAsText}
	out := bufio.NewWriterSize(stdout, 1<<16)
	defer out.Flush()
	if *jsonl {
		return convertLines(stdin, out, func(dst, line []byte) ([]byte, error) {
			if *decode {
				return decodeLine(dst, tok, line, *skipSpecial)
			}
			return encodeLine(dst, tok, line, opts)
		})
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		return err
	}
	if *decode {
		var ids []int32
		if err := json.Unmarshal(in, &ids); err != nil {
			return fmt.Errorf("want a JSON array of token ids on stdin: %w", err)
		}
		text, err := tok.Decode(ids, *skipSpecial)
		if err != nil {
			return err
		}
		_, err = out.WriteString(text)
		return err
	}
	_, err = out.Write(append(appendIDs(nil, tok.EncodeWith(string(in), opts)), '\n'))
	return err
}

// convertLines writes convert's output for each input line, one per line.
func convertLines(r io.Reader, w *bufio.Writer, convert func(dst, line []byte) ([]byte, error)) error {
	in := bufio.NewReaderSize(r, 1<<16)
	for n := 1; ; n++ {
		line, err := in.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			return nil
		}
		if err != nil && err != io.EOF {
			return err
		}
		converted, err := convert(w.AvailableBuffer(), bytes.TrimRight(line, "\r\n"))
		if err != nil {
			return fmt.Errorf("input line %d: %w", n, err)
		}
		if _, err := w.Write(append(converted, '\n')); err != nil {
			return err
		}
	}
}

// encodeLine appends the JSON array of ids of one JSON string.
func encodeLine(dst []byte, tok *tokenizer.Tokenizer, line []byte, opts tokenizer.EncodeOptions) ([]byte, error) {
	var text string
	if err := json.Unmarshal(line, &text); err != nil {
		return nil, fmt.Errorf("want a JSON string: %w", err)
	}
	return appendIDs(dst, tok.EncodeWith(text, opts)), nil
}

func appendIDs(dst []byte, ids []int32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(id), 10)
	}
	return append(dst, ']')
}

// decodeLine appends the text of one JSON array of ids as a JSON string.
func decodeLine(dst []byte, tok *tokenizer.Tokenizer, line []byte, skipSpecial bool) ([]byte, error) {
	var ids []int32
	if err := json.Unmarshal(line, &ids); err != nil {
		return nil, fmt.Errorf("want a JSON array of token ids: %w", err)
	}
	text, err := tok.Decode(ids, skipSpecial)
	if err != nil {
		return nil, err
	}
	var quoted bytes.Buffer
	enc := json.NewEncoder(&quoted)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(text); err != nil {
		return nil, err
	}
	return append(dst, bytes.TrimSuffix(quoted.Bytes(), []byte("\n"))...), nil
}
