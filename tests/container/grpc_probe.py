#!/usr/bin/python3
"""Calls a gRPC endpoint of the server through whatever stands in front of it (the compose
balancer): grpc.health.v1.Health/Check and ServerLive, then ModelInfer of the seed-sized
request, whose output must be finite.  Stubs are generated from the project's own
api/grpc/*.proto into a temporary folder, as the grpc suite does.

Usage: grpc_probe.py HOST:PORT.  Prints one line of what it saw; exits 0 when every call
answered as it should, 1 otherwise.
"""
import array
import math
import os
import subprocess
import sys
import tempfile

import grpc  # Debian's python3-grpcio

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def main():
    target = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="attn-grpc-probe-") as stubs:
        subprocess.run(["protoc", "-I" + os.path.join(ROOT, "api", "grpc"),
                        "--python_out=" + stubs, "--grpc_python_out=" + stubs,
                        "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                        os.path.join(ROOT, "api", "grpc", "inference.proto"),
                        os.path.join(ROOT, "api", "grpc", "health.proto")], check=True)
        sys.path.insert(0, stubs)
        import health_pb2 as hpb
        import health_pb2_grpc as hpg
        import inference_pb2 as pb
        import inference_pb2_grpc as pg
        with grpc.insecure_channel(target) as channel:
            status = hpg.HealthStub(channel).Check(hpb.HealthCheckRequest(), timeout=10).status
            stub = pg.GRPCInferenceServiceStub(channel)
            live = stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
            req = pb.ModelInferRequest(model_name="attention")
            for name, shape, data in (("q", [2, 2], [1, 0, 0, 1]), ("k", [3, 2], [1, 0, 0, 1, 1, 1]),
                                      ("v", [3, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9])):
                req.inputs.add(name=name, datatype="FP32", shape=shape)
                req.raw_input_contents.append(array.array("f", data).tobytes())
            req.outputs.add(name="output")
            out = stub.ModelInfer(req, timeout=30)
            values = array.array("f", out.raw_output_contents[0]).tolist()
    good = (status == hpb.HealthCheckResponse.SERVING and live and list(out.outputs[0].shape) == [2, 3]
            and len(values) == 6 and all(math.isfinite(x) for x in values))
    print(f"health={status} live={live} output={values}")
    return 0 if good else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except grpc.RpcError as e:
        print(f"gRPC error: {e.code()} {e.details()}")
        sys.exit(1)
