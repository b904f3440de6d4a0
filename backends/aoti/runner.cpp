// Reference C++ consumer of an exporter `model.pt2`: loads the AOTInductor package without Python,
// prefills the prompt token ids, then decodes greedily and prints the new ids, space-separated.
//
//   aoti_runner MODEL.pt2 MAX_NEW_TOKENS ID [ID ...] [--eos ID ...]
//
// The program's signature is forward(tokens int64[1, T], input_pos int64[1]) -> logits f32[1, V];
// the KV cache lives inside the package, so each call continues where the last one stopped.
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

int64_t argmax_last(const at::Tensor& logits) {
  return logits.reshape({-1}).argmax().item<int64_t>();
}

int usage() {
  std::cerr << "usage: aoti_runner MODEL.pt2 MAX_NEW_TOKENS ID [ID ...] [--eos ID ...]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return usage();
  const std::string package = argv[1];
  const int max_new = std::atoi(argv[2]);
  std::vector<int64_t> prompt;
  std::unordered_set<int64_t> eos;
  bool reading_eos = false;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--eos") {
      reading_eos = true;
      continue;
    }
    (reading_eos ? eos.insert(std::stoll(arg)), void() : prompt.push_back(std::stoll(arg)));
  }
  if (prompt.empty() || max_new < 1) return usage();

  try {
    torch::inductor::AOTIModelPackageLoader loader(package);
    auto opts = at::TensorOptions().dtype(at::kLong);
    at::Tensor tokens = at::tensor(prompt, opts).reshape({1, static_cast<int64_t>(prompt.size())});
    at::Tensor pos = at::zeros({1}, opts);
    int64_t next = argmax_last(loader.run({tokens, pos})[0]);
    std::vector<int64_t> out{next};
    while (static_cast<int>(out.size()) < max_new && !eos.count(next)) {
      tokens = at::full({1, 1}, next, opts);
      pos = at::full({1}, static_cast<int64_t>(prompt.size() + out.size() - 1), opts);
      next = argmax_last(loader.run({tokens, pos})[0]);
      out.push_back(next);
    }
    for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? " " : "") << out[i];
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << package << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
