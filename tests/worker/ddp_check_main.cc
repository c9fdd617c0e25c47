int DdpCheckMain(int argc, char** argv);
int main(int argc, char** argv) { return DdpCheckMain(argc, argv); }
