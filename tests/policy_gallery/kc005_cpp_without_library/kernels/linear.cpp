// linear.cpp: y = x W^T as a host loop instead of cuBLAS.  EXPECT: KC005
extern "C" int linear_launcher(void* handle, const float* x, const float* w, float* y, int rows,
                               int in_features, int out_features) {
  (void)handle;
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out_features; ++o) {
      float acc = 0.0f;
      for (int i = 0; i < in_features; ++i) acc += x[r * in_features + i] * w[o * in_features + i];
      y[r * out_features + o] = acc;
    }
  return 0;
}
