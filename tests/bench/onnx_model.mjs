// onnx_model.mjs - the ONNX models of the ONNX Runtime rows (bench_ort.sh), written as protobuf
// bytes here: one attention node between graph inputs q, k, v and its outputs.
//
// Debian has no python3-onnx, and a model of one node needs only a dozen protobuf fields, so they
// are written by hand. Field numbers are those of onnx/onnx.proto (ModelProto, GraphProto,
// NodeProto, AttributeProto, ValueInfoProto, TypeProto, TensorShapeProto, OperatorSetIdProto).
//
//   attentionModel({op, dtype, batch, heads, len, headDim, causal, probabilities})
//     op "mha":         com.microsoft MultiHeadAttention (num_heads, unidirectional, scale);
//                       float32 only, output only
//     op "attention23": the opset-23 Attention (q_num_heads, kv_num_heads, is_causal, scale), and
//                       with probabilities its qk_matmul_output after the softmax (mode 3)
//   q, k, v and the output are batch x len x (heads * headDim); the probabilities output is
//   batch x heads x len x len. Returns a Uint8Array for InferenceSession.create.

const WIRE_VARINT = 0;
const WIRE_BYTES = 2;
const WIRE_FIXED32 = 5;
const ELEM_TYPE = { float32: 1, float64: 11 }; // TensorProto.DataType FLOAT, DOUBLE
const ATTR_FLOAT = 1; // AttributeProto.AttributeType
const ATTR_INT = 2;
const IR_VERSION = 11; // the IR of ONNX 1.18, which brought opset 23

function varint(value) {
  const out = [];
  let v = BigInt(value);
  if (v < 0n) v += 1n << 64n; // int64 fields: two's complement in ten bytes
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) byte |= 0x80;
    out.push(byte);
  } while (v !== 0n);
  return out;
}

const key = (field, wire) => varint((field << 3) | wire);
const intField = (field, value) => [...key(field, WIRE_VARINT), ...varint(value)];
const bytesField = (field, bytes) => [...key(field, WIRE_BYTES), ...varint(bytes.length), ...bytes];
const stringField = (field, text) => bytesField(field, [...new TextEncoder().encode(text)]);

function floatField(field, value) {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setFloat32(0, value, true);
  return [...key(field, WIRE_FIXED32), ...b];
}

// AttributeProto: name 1, f 2, i 3, type 20.
const intAttr = (name, value) =>
  bytesField(5, [...stringField(1, name), ...intField(3, value), ...intField(20, ATTR_INT)]);
const floatAttr = (name, value) =>
  bytesField(5, [...stringField(1, name), ...floatField(2, value), ...intField(20, ATTR_FLOAT)]);

// ValueInfoProto (name 1, type 2) of a tensor: TypeProto.tensor_type 1 { elem_type 1, shape 2 },
// TensorShapeProto.dim 1 { dim_value 1 }.
function tensorInfo(field, name, dtype, shape) {
  const dims = shape.flatMap((d) => bytesField(1, intField(1, d)));
  const tensor = [...intField(1, ELEM_TYPE[dtype]), ...bytesField(2, dims)];
  return bytesField(field, [...stringField(1, name), ...bytesField(2, bytesField(1, tensor))]);
}

// NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7.
function node(opType, domain, inputs, outputs, attributes) {
  return [
    ...inputs.flatMap((n) => stringField(1, n)),
    ...outputs.flatMap((n) => stringField(2, n)),
    ...stringField(3, 'attention'),
    ...stringField(4, opType),
    ...attributes.flat(),
    ...stringField(7, domain),
  ];
}

export function attentionModel({ op, dtype, batch, heads, len, headDim, causal, probabilities }) {
  if (!(dtype in ELEM_TYPE)) throw new Error(`dtype ${dtype}: float32 or float64`);
  const hidden = heads * headDim;
  const scale = 1 / Math.sqrt(headDim);
  const io = [batch, len, hidden];
  let attention;
  let outputs = [tensorInfo(12, 'output', dtype, io)];
  if (op === 'mha') {
    if (dtype !== 'float32' || probabilities) throw new Error('MultiHeadAttention: float32, output only');
    attention = node('MultiHeadAttention', 'com.microsoft', ['q', 'k', 'v'], ['output'], [
      intAttr('num_heads', heads), intAttr('unidirectional', causal ? 1 : 0), floatAttr('scale', scale)]);
  } else if (op === 'attention23') {
    const attrs = [intAttr('q_num_heads', heads), intAttr('kv_num_heads', heads),
      intAttr('is_causal', causal ? 1 : 0), floatAttr('scale', scale)];
    const names = ['output'];
    if (probabilities) {
      attrs.push(intAttr('qk_matmul_output_mode', 3)); // the weights after the softmax
      names.push('', '', 'probabilities'); // present_key and present_value not asked for
      outputs.push(tensorInfo(12, 'probabilities', dtype, [batch, heads, len, len]));
    }
    attention = node('Attention', '', ['q', 'k', 'v'], names, attrs);
  } else {
    throw new Error(`op ${op}: mha or attention23`);
  }
  const graph = [
    ...bytesField(1, attention),
    ...stringField(2, 'attention-bench'),
    ...['q', 'k', 'v'].flatMap((n) => tensorInfo(11, n, dtype, io)),
    ...outputs.flat(),
  ];
  const opset = (domain, version) => bytesField(8, [...stringField(1, domain), ...intField(2, version)]);
  return Uint8Array.from([
    ...intField(1, IR_VERSION),
    ...stringField(2, 'attention-server bench'),
    ...bytesField(7, graph),
    ...opset('', 23),
    ...opset('com.microsoft', 1),
  ]);
}
